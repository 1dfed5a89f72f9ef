"""When a bounded-mode worker pays for a weight load (issue 27): the floor rule and the drift rule.

Under run.mode bounded (k = run.max_staleness >= 1) a worker keeps generating with the weights it holds,
v_h, while they are at least the open epoch's floor v_{e-k} (protocol/versions.py): its groups are then
trainable in epoch e, so loading a newer version would buy nothing the bound does not already allow.
It loads (the publisher's newest) only
- when the floor passes it (`floor` pull: its next groups would be refused as too stale), or
- earlier, when `worker.sync_kl_threshold` is set and the estimated divergence of the policy it holds
  from the newest published one crosses the threshold (`drift` pull): the AAPS idea of the env actors
  (envs/acting.py `should_fetch`, docs/ENVS.md) applied to LLM workers, pull-based as there.

The divergence estimate (`drift_estimate`): the trainer measures, after each optimizer step v_i ->
v_{i+1}, the mean per-token KL(v_i || v_{i+1}) on a probe of that epoch's own sampled tokens
(training/drift.py); the coordinator announces the newest version and the recent steps' KLs with
every EpochStart and HeartbeatAck; the worker combines the steps it has not loaded,
h -> h+1 -> ... -> newest, as (sum_i sqrt(KL_i))^2. sqrt(2 KL) is, to second order, the Fisher-metric
length of a step, so by the triangle inequality the sum of the square roots bounds sqrt(KL(v_h ||
v_newest)) from above to that order: the estimate is the worst case (steps all in one direction)
and pulls rather early than late. A step whose KL is unknown makes the estimate unknown (no drift
pull; the floor rule still holds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

UNKNOWN = -1.0  # a step whose KL the coordinator has not heard (on the wire: -1.0)


def drift_estimate(held: int, newest: int, step_kls: Mapping[int, float]) -> float | None:
    """Estimated KL(v_held || v_newest) from the per-step KLs (step_kls[i] = KL(v_i || v_{i+1}), >= 0):
    (sum over i in [held, newest) of sqrt(KL_i))^2; 0.0 when nothing is newer; None when a step's KL
    is unknown (missing or negative) or `held` is no version."""
    if held < 0:
        return None
    if newest <= held:
        return 0.0
    total = 0.0
    for i in range(held, newest):
        kl = step_kls.get(i, UNKNOWN)
        if not kl >= 0.0:  # missing, -1 or NaN
            return None
        total += math.sqrt(kl)
    return total * total


def should_pull(threshold: float | None, estimate: float | None, held: int, newest: int) -> bool:
    """The drift rule: pull early when a newer version is published and the estimate exceeds the
    threshold. Threshold 0 pulls every newer version (whatever its KL, as AAPS's threshold 0: the
    baseline); None (the default) never pulls early (the floor rule alone)."""
    if threshold is None or newest <= held:
        return False
    if threshold == 0.0:
        return True
    return estimate is not None and estimate > threshold


def announced(newest: int, step_kls: list[float]) -> dict[int, float]:
    """The wire form (EpochStart / HeartbeatAck `newest`, `step_kls`: the KLs of the steps that made the
    last len(step_kls) versions up to `newest`) as {i: KL(v_i || v_{i+1})}, unknown ones left out."""
    first = newest - len(step_kls)
    return {first + j: kl for j, kl in enumerate(step_kls) if kl >= 0.0}


def to_wire(newest: int, oldest: int, step_kls: Mapping[int, float]) -> list[float]:
    """The KLs of steps oldest -> oldest+1 ... newest-1 -> newest, UNKNOWN where not heard; [] when
    nothing is newer than `oldest`."""
    return [float(step_kls.get(i, UNKNOWN)) for i in range(max(oldest, 0), newest)]
