"""Sampling on the device, with no host sync: the behaviour transform of training/behaviour.py on
logits, a draw at a given uniform, and the drawn token's behaviour log-prob.

The arithmetic is the running batch's (engines/batching.py `draw` plus `behaviour_logprobs`): the
repetition penalty (from a [B, V] `seen` mask instead of a context matrix: the same mask `penalise`
builds), then `shaped_logits`' temperature, min_p, top_k and top_p, then the inverse CDF in float64 at
the row's uniform; the log-prob is log_softmax of the same shaped logits at the drawn token (a token
drawn from the kept set is in it, so this equals `behaviour_logprobs`, which only forces the target
into the set). Shapes are static and no value is read on the host, so a captured decode step
(engines/graphs.py) can include it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from prl_actors.training.behaviour import Behaviour, penalise_seen, shaped_logits


class DeviceSampler:
    """token, log q(token) per row from logits; settings fixed (a new Behaviour: a new sampler)."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.rest = replace(behaviour, repetition_penalty=1.0)  # steps 2-5 (the penalty is applied here)
        self.plain = self.rest == Behaviour()  # no control on: q = softmax(logits), as shaped_logits returns

    @property
    def penalised(self) -> bool:
        return self.behaviour.penalised

    def __call__(
        self, logits: torch.Tensor, u: torch.Tensor, seen: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [B, V]; u [B, 1] float64 uniforms; seen [B, V] bool (tokens in the row's context,
        needed with a repetition penalty). Returns token [B, 1] long and its log-prob [B, 1] (float32
        at least; 0 for greedy)."""
        z = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()  # [B, V]
        b = self.behaviour
        if b.penalised:
            if seen is None:
                raise ValueError("the repetition penalty needs the rows' seen tokens")
            z = penalise_seen(z, seen, b.repetition_penalty)
        shaped = z if self.plain else shaped_logits(z, self.rest)  # [B, V]
        if b.temperature == 0:
            token = shaped.argmax(dim=-1, keepdim=True)
            return token, z.new_zeros(token.shape)
        cdf = torch.softmax(shaped, dim=-1).double().cumsum(dim=-1)  # [B, V]
        token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=logits.shape[-1] - 1)  # [B, 1]
        logp = torch.log_softmax(shaped, dim=-1).gather(-1, token)  # [B, 1]
        return token, logp
