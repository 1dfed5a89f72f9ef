"""The behaviour distribution: the one log-prob transform shared by the engines and the trainer.

Convention (every engine follows it): for each sampled token an engine reports log q(token), where q
is the distribution the token was actually drawn from,

    q = softmax(logits / T) restricted to the top-p nucleus, renormalised,

the nucleus being the smallest set of tokens with mass >= top_p (the top token always kept; exactly
what `nucleus_mask` selects). With T = 1 and top_p = 1 this is the raw log_softmax. The trainer
scores the same tokens with the same transform on its own logits, so with the same weights engine
and trainer agree token by token and the strict on-policy ratio is 1.

Greedy decoding (T = 0) draws from a point mass: its log-prob is 0. Training refuses T = 0 (every
sample of a group would be identical; see config.py).
"""

from __future__ import annotations

import torch


@torch.no_grad()
def nucleus_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """[..., V] bool: True on the smallest set of tokens with mass >= top_p (the top token always
    kept; a token is in when the mass strictly before it, in descending order, is < top_p).
    probs: [..., V] (rows sum to 1)."""
    if top_p >= 1.0:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_p, order = probs.sort(dim=-1, descending=True)  # [..., V]
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token, [..., V]
    keep_sorted = before < top_p
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def behaviour_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """log q(target) per row, [N] (float32 at least), differentiable through `logits` ([N, V]).

    The nucleus is computed without grad and always contains the target, so a target that float
    noise put just outside it gets a finite log-prob (never -inf). temperature == 0: zeros."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32; fp64 stays
    if temperature == 0:
        return torch.zeros(targets.shape, dtype=logits.dtype, device=logits.device)
    scaled = logits / temperature if temperature != 1.0 else logits  # [N, V]
    if top_p < 1.0:
        keep = nucleus_mask(torch.softmax(scaled.detach(), dim=-1), top_p)  # [N, V]
        keep = keep.scatter(-1, targets[:, None], True)
        scaled = scaled.masked_fill(~keep, float("-inf"))
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets[:, None]).squeeze(-1)  # [N]
