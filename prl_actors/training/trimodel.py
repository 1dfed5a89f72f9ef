"""The unified tri-model: policy, old policy and reference log-probs from one call.

Strict on-policy (periodic asynchrony trains each epoch on samples of that epoch's weights), so the
old policy *is* the policy: its log-probs are the policy's, detached — no second forward, and the
ratio is exactly 1 in value while its gradient is d logp (after the first of M x mu minibatch steps
the learner passes the frozen epoch-start policy's log-probs as `behaviour`). The reference is a
frozen copy of the
initial weights; its forward runs under no_grad and is skipped entirely when beta == 0. With LoRA
(a peft policy) the reference is the policy itself with its adapter disabled: the base weights are
the initial weights and are never trained, so no copy is made.

All three score tokens under the behaviour transform (penalty, temperature, min_p, top_k, top-p:
training/behaviour.py),
the distribution the engine drew them from.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from prl_actors.training.behaviour import Behaviour, as_behaviour, behaviour_logprobs
from prl_actors.training.losses import optional_entropy
from prl_actors.training.packing import ModelBatch, response_logits, response_logprobs


@dataclass
class TriLogprobs:
    """Per response token, [N] each: policy (with grad), old policy (detached), reference or None."""

    policy: torch.Tensor
    old: torch.Tensor
    ref: torch.Tensor | None
    entropy: torch.Tensor | None = None  # [N] the policy's behaviour entropy (with grad: the bonus), when asked for


class TriModel(torch.nn.Module):
    """Holds the trainable policy and (when `with_reference`) a frozen copy of its initial weights,
    or, for a LoRA policy, nothing more: its reference is the adapter switched off."""

    def __init__(
        self,
        policy: torch.nn.Module,
        with_reference: bool,
        temperature: float | Behaviour = 1.0,
        top_p: float = 1.0,
    ) -> None:
        super().__init__()
        self.policy = policy
        self.adapter_reference = with_reference and hasattr(policy, "disable_adapter")
        copied = with_reference and not self.adapter_reference
        self.reference = copy.deepcopy(policy).requires_grad_(False).eval() if copied else None
        self.transform = as_behaviour(temperature, top_p)

    def forward(
        self,
        batch: ModelBatch,
        behaviour: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        with_entropy: bool = False,
        measure_entropy: bool = False,
    ) -> TriLogprobs:
        """`behaviour` ([N], optional) overrides the old-policy log-probs: the frozen epoch-start
        policy's after an epoch's first minibatch step (training/grpo.py), or the engine's for a
        future off-policy mode; by default old = policy, detached (strict on-policy). `context`
        ([N, C]): each token's context, needed with a repetition penalty (behaviour.response_contexts).
        `with_entropy`: the entropy with its gradient (the entropy bonus); `measure_entropy` alone: its
        value, from the same logits under no_grad (the entropy metric)."""
        b = self.transform
        logits = response_logits(self.policy, batch)  # [N, V]
        ctx = None if context is None else context.to(logits.device)
        logp = behaviour_logprobs(logits, batch.targets, b, context=ctx)  # [N]
        ent = optional_entropy(logits, b, ctx, with_entropy, measure_entropy)  # [N] or None
        ref = None
        if self.reference is not None:
            with torch.no_grad():
                ref = response_logprobs(self.reference, batch, b, context=context)  # [N]
        elif self.adapter_reference:
            with torch.no_grad(), self.policy.disable_adapter():  # type: ignore[operator]
                ref = response_logprobs(self.policy, batch, b, context=context)  # [N]
        old = logp.detach() if behaviour is None else behaviour.to(logp)
        return TriLogprobs(policy=logp, old=old, ref=ref, entropy=ent)
