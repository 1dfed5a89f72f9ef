"""The behaviour distribution: the one log-prob transform shared by the engines and the trainer.

Convention (every engine follows it): for each sampled token an engine reports log q(token), where q
is the distribution the token was actually drawn from. q is built from the model's logits z by, in
this order (vLLM 0.32's order; Hugging Face's for everything but min_p):

1. repetition penalty p (`Behaviour.repetition_penalty`, HF/vLLM semantics): the logit of every
   token present in the context (prompt + response generated so far) is divided by p if positive,
   multiplied by p if not;
2. temperature: z / T;
3. min_p: tokens whose probability (softmax of 2) is < min_p x the top probability are dropped;
4. top_k: only the k largest logits stay (ties with the k-th stay too);
5. top_p: of what is left (renormalised), the smallest set with mass >= top_p (the top token always
   kept; exactly what `nucleus_mask` selects);

then q = softmax over the kept tokens. With every control off (T = 1, top_p = 1, top_k = 0,
min_p = 0, p = 1) this is the raw log_softmax. The trainer scores the same tokens with the same
transform on its own logits, with each token's own context for the penalty, so with the same weights
engine and trainer agree token by token and the strict on-policy ratio is 1.

Greedy decoding (T = 0) draws the argmax of the penalised logits (a point mass): its log-prob is 0.
Training refuses T = 0 (every sample of a group would be identical; see config.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Behaviour:
    """The sampling transform's settings (worker.sampling's fields of the same names)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off

    @classmethod
    def of(cls, sampling: Any) -> Behaviour:
        """From a SamplingSection (or anything with these attributes)."""
        return cls(
            float(sampling.temperature),
            float(sampling.top_p),
            int(getattr(sampling, "top_k", 0)),
            float(getattr(sampling, "min_p", 0.0)),
            float(getattr(sampling, "repetition_penalty", 1.0)),
        )

    @property
    def penalised(self) -> bool:
        """Does the transform depend on the context (the repetition penalty)?"""
        return self.repetition_penalty != 1.0


def as_behaviour(temperature: float | Behaviour, top_p: float = 1.0) -> Behaviour:
    """The old (temperature, top_p) call style or a Behaviour, as a Behaviour."""
    return temperature if isinstance(temperature, Behaviour) else Behaviour(float(temperature), float(top_p))


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


def context_matrix(contexts: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> torch.Tensor:
    """[N, C] long: row n lists the tokens of context n (non-empty), right-padded with its own first
    token (a repeat changes nothing: the penalty applies once per distinct token)."""
    width = max(len(c) for c in contexts)
    out = torch.empty((len(contexts), width), dtype=torch.long)  # [N, C]
    for i, c in enumerate(contexts):
        out[i, : len(c)] = torch.as_tensor(list(c), dtype=torch.long)
        out[i, len(c) :] = c[0]
    return out.to(device)


def response_contexts(groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> torch.Tensor:
    """[N, C] long: for every response token (group, sample, position order, as in ModelBatch) the
    context it was drawn in: the prompt and the response's tokens before it, padded with the
    prompt's first token. Built per sample as a [L, P + L] matrix, without a Python loop per token."""
    blocks: list[torch.Tensor] = []
    for prompt, responses in groups:
        n_prompt = len(prompt)
        for resp in responses:
            seq = torch.as_tensor([*prompt, *resp], dtype=torch.long)  # [P + L]
            n = len(resp)
            cols = torch.arange(n_prompt + n)  # [P + L]
            hidden = cols[None, :] >= n_prompt + torch.arange(n)[:, None]  # [L, P + L]: not yet generated
            blocks.append(torch.where(hidden, seq[0], seq.expand(n, -1)))
    if not blocks:
        return torch.zeros((0, 1), dtype=torch.long)
    width = max(b.shape[1] for b in blocks)
    padded = [torch.cat([b, b[:, :1].expand(-1, width - b.shape[1])], dim=1) for b in blocks]
    return torch.cat(padded)  # [N, C]


def penalise(logits: torch.Tensor, context: torch.Tensor, penalty: float) -> torch.Tensor:
    """HF/vLLM repetition penalty: every token of row n's context gets its logit divided by
    `penalty` if positive, multiplied by it otherwise. logits: [N, V]; context: [N, C] token ids.
    Differentiable (out of place). The seen tokens are a [N, V] mask, not a scatter of the context's
    values: a token repeated in the context must still pass its gradient once."""
    seen = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device).scatter_(-1, context, True)  # [N, V]
    return penalise_seen(logits, seen, penalty)


def penalise_seen(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """`penalise` given the seen tokens as a [N, V] bool mask (the engine's device path keeps one)."""
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


@torch.no_grad()
def keep_mask(scaled: torch.Tensor, b: Behaviour) -> torch.Tensor | None:
    """[N, V] bool: the tokens min_p, top_k and top_p keep (steps 3-5), None when none is on.
    scaled: [N, V], the penalised logits divided by the temperature."""
    keep: torch.Tensor | None = None
    if b.min_p > 0:
        probs = torch.softmax(scaled, dim=-1)  # [N, V]
        keep = probs >= b.min_p * probs.amax(dim=-1, keepdim=True)
    if 0 < b.top_k < scaled.shape[-1]:
        kth = scaled.topk(b.top_k, dim=-1).values[..., -1:]  # [N, 1]
        in_k = scaled >= kth
        keep = in_k if keep is None else keep & in_k
    if b.top_p < 1.0:
        left = scaled if keep is None else scaled.masked_fill(~keep, float("-inf"))
        nucleus = nucleus_mask(torch.softmax(left, dim=-1), b.top_p)
        keep = nucleus if keep is None else keep & nucleus
    return keep


def shaped_logits(
    logits: torch.Tensor, b: Behaviour, context: torch.Tensor | None = None, targets: torch.Tensor | None = None
) -> torch.Tensor:
    """[N, V] (float32 at least): the logits q is the softmax of (steps 1-5), -inf outside the kept
    set. `context` ([N, C] token ids) is needed when the repetition penalty is on. `targets` ([N]),
    when given, are always kept: a token that float noise put just outside the trainer's set gets a
    finite log-prob (never -inf). Differentiable through `logits`; the kept set carries no grad.
    Temperature 0 returns the penalised logits (greedy takes their argmax)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32; fp64 stays
    if b.penalised:
        if context is None:
            raise ValueError("the repetition penalty needs each token's context (prompt + response so far)")
        logits = penalise(logits, context, b.repetition_penalty)
    if b.temperature == 0:
        return logits
    scaled = logits / b.temperature if b.temperature != 1.0 else logits  # [N, V]
    keep = keep_mask(scaled.detach(), b)
    if keep is None:
        return scaled
    if targets is not None:
        keep = keep.scatter(-1, targets[:, None], True)
    return scaled.masked_fill(~keep, float("-inf"))


def behaviour_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float | Behaviour,
    top_p: float = 1.0,
    context: torch.Tensor | None = None,
) -> torch.Tensor:
    """log q(target) per row, [N] (float32 at least), differentiable through `logits` ([N, V]).

    `temperature` is a Behaviour, or the temperature with `top_p` (the other controls off).
    `context`: [N, C], each row's context (needed with a repetition penalty). Temperature 0: zeros."""
    b = as_behaviour(temperature, top_p)
    if b.temperature == 0:
        dtype = torch.promote_types(logits.dtype, torch.float32)
        return torch.zeros(targets.shape, dtype=dtype, device=logits.device)
    shaped = shaped_logits(logits, b, context, targets)  # [N, V]
    return torch.log_softmax(shaped, dim=-1).gather(-1, targets[:, None]).squeeze(-1)  # [N]
