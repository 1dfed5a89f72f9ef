"""The bounded-staleness invariant from the logs alone: "no trained sample older than k versions".

Every trainer `train_group` event names the epoch it was trained in (`msg_epoch`) and the weights it
was generated with (`msg_version`); `protocol.versions.staleness` turns the pair into j (v_{e-j}).
k is `run.max_staleness` under `run.mode: bounded` and 0 otherwise (strict on-policy: every j is 0),
from RUN_DIR/config.yaml (0 without one). The histogram {j: groups} is reported per run and per epoch.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from prl_actors.protocol.versions import staleness, within_bound
from prl_actors.replay.events import Event, ReplayError, Run, Violation, at, run_config


def max_staleness(run: Run) -> int:
    """k of the run: run.max_staleness in bounded mode, else 0 (also without a readable config)."""
    try:
        cfg = run_config(run.run_dir)
    except ReplayError:
        return 0
    return 0 if cfg is None else cfg.run.staleness_bound()


def _trained(run: Run) -> list[Event]:
    return [e for e in run.of("train_group") if e.get("role") == "trainer"]


def histogram(run: Run) -> dict[int, dict[int, int]]:
    """epoch -> {staleness j: trained groups}, both sorted."""
    per: dict[int, Counter[int]] = defaultdict(Counter)
    for t in _trained(run):
        epoch, version = int(t.get("msg_epoch", -1)), int(t.get("msg_version", -1))
        per[epoch][staleness(epoch, version)] += 1
    return {e: dict(sorted(c.items())) for e, c in sorted(per.items())}


def total(hist: dict[int, dict[int, int]]) -> dict[int, int]:
    """The run's histogram {j: groups} summed over epochs."""
    out: Counter[int] = Counter()
    for c in hist.values():
        out.update(c)
    return dict(sorted(out.items()))


def render(hist: dict[int, int]) -> str:
    """`j=0: 12, j=1: 4` (or `none trained`)."""
    return ", ".join(f"j={j}: {n}" for j, n in hist.items()) or "none trained"


def check_staleness(run: Run, k: int | None = None) -> list[Violation]:
    """A Violation for each trained group generated with weights outside v_{e-k} .. v_e."""
    bound = max_staleness(run) if k is None else k
    out = []
    for t in _trained(run):
        epoch, version = int(t.get("msg_epoch", -1)), int(t.get("msg_version", -1))
        if not within_bound(epoch, version, bound):
            j = staleness(epoch, version)
            what = f"group {t.get('group_id')} of epoch {epoch} ({at(t)})"
            out.append(Violation("staleness", f"{what} was generated with v{version}: staleness {j}, bound {bound}"))
    return out
