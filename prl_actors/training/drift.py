"""The step's drift for bounded mode's pull policy: KL(v_e || v_{e+1}) of one optimizer step.

`worker.sync_kl_threshold` (weights/pulls.py) needs, for each published version, how far the policy
moved in the step that made it. The trainer measures it on a probe: the first PROBE_GROUPS groups it
received in the epoch (their prompts and sampled tokens, as trained), scored without gradients by the
policy before the step (v_e) and after it (v_{e+1}); the step's KL is the mean over their model tokens
of the k3 estimator (losses.k3_kl: exp(d) - d - 1 with d = log v_{e+1} - log v_e, >= 0, unbiased for
KL(v_e || v_{e+1}) on tokens drawn from v_e). The tokens were drawn from the behaviour policy mu
(v_{e-j}, j <= k), not from v_e: the estimate is KL on the behaviour's tokens, which is what a worker
holding older weights samples. Cost: two forwards of PROBE_GROUPS groups, no backward (well under the
epoch's B forwards and backwards for B >> PROBE_GROUPS); the loss, gradients and weights are untouched.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from prl_actors.training.behaviour import response_contexts
from prl_actors.training.losses import k3_kl
from prl_actors.training.packing import collate, response_logprobs

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Group
    from prl_actors.trainer.config import TrainerSection
    from prl_actors.training.trimodel import TriModel

PROBE_GROUPS = 2


@runtime_checkable
class ProbedLearner(Protocol):
    """What the probe reads of a learner (the GRPO learner, training/grpo.py): its models, device and
    autocast, and how far into the epoch it stepped."""

    tri: TriModel
    cfg: TrainerSection
    device: torch.device
    policy: torch.nn.Module
    frozen: torch.nn.Module | None
    epoch_steps: int

    def _autocast(self) -> contextlib.AbstractContextManager[None]: ...


def epoch_start_model(learner: object) -> torch.nn.Module:
    """The epoch-start policy v_e: the policy itself until the epoch's first optimizer step, then the
    frozen copy (trainer.num_minibatches / num_iterations > 1 step inside the epoch: training/grpo.py).
    Raises TypeError for a learner without a probe (not the GRPO learner)."""
    if not isinstance(learner, ProbedLearner):
        raise TypeError(f"{type(learner).__name__} has no drift probe (not the GRPO learner)")
    if learner.frozen is not None and learner.epoch_steps > 0:
        return learner.frozen
    return learner.policy


def probe_logprobs(learner: object, groups: list[Group], model: torch.nn.Module | None = None) -> torch.Tensor | None:
    """[N] float64 on the CPU: log-probs of the model tokens of `groups` under `model` (default: the
    learner's current policy), with training's behaviour transform (environment tokens of multi-turn
    samples left out); None when the probe is empty or the learner is not the GRPO learner."""
    if not groups or not isinstance(learner, ProbedLearner):
        return None
    policy = learner.tri
    pairs = [(g.prompt_ids, [s.token_ids for s in g.samples]) for g in groups]
    batch = collate(pairs, learner.cfg.shared_prompt).to(learner.device)
    if batch.targets.numel() == 0:
        return None
    context = response_contexts(pairs) if policy.transform.penalised else None  # [N, C]
    with torch.no_grad(), learner._autocast():
        logp = response_logprobs(model or learner.policy, batch, policy.transform, context=context)  # [N]
    sampled = torch.tensor([m for g in groups for s in g.samples for m in s.model_mask()], dtype=torch.bool)  # [N]
    return logp.detach().to("cpu", torch.float64)[sampled]


def step_kl(before: torch.Tensor, after: torch.Tensor) -> float:
    """Mean k3 estimate of KL(before || after) over the probe's tokens; before, after: [N] log-probs of
    the same tokens under the policy before and after the step."""
    if before.numel() == 0 or before.shape != after.shape:
        return -1.0
    return float(k3_kl(before, after).mean())
