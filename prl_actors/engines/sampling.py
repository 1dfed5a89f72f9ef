"""Batched autoregressive sampling with a KV cache (the torch engine's core, plain functions).

Rows are left-padded prompts; row r belongs to group `row_group[r]` and draws its random numbers
from that group's own `torch.Generator`, so a group's samples depend only on its generator and the
weights, not on which other groups share the batch (up to float noise of the batched matmuls).

Log-probs: for every sampled token we return its log-prob under the distribution it was drawn from
(softmax(logits / T) restricted to the top-p nucleus, renormalised; 0 for greedy), computed by
`training.behaviour.behaviour_logprobs`, the very function the trainer scores tokens with.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from prl_actors.training.behaviour import behaviour_logprobs, nucleus_mask


@dataclass
class SampleResult:
    """Per row: response token ids (eos included when it was produced), their behaviour log-probs, and
    whether the row stopped on eos (False = hit max_new_tokens)."""

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    finished: list[bool]


def seed_for(*parts: int) -> int:
    """A stable 63-bit seed from integers, e.g. (run seed, version, group id)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [B, T], attention_mask [B, T]) with every row right-aligned."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return ids, mask


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail of each row outside the smallest set with mass >= top_p (the top token is
    always kept; the set of `nucleus_mask`); rows are not renormalised (multinomial does not need
    it). probs: [B, V]."""
    if top_p >= 1.0:
        return probs
    return probs.masked_fill(~nucleus_mask(probs, top_p), 0.0)


def choose_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generators: list[torch.Generator],
    row_group: list[int],
) -> torch.Tensor:
    """Next token per row, [B]: argmax when temperature == 0, else a draw from
    softmax(logits / temperature) restricted to the top-p nucleus. logits: [B, V] float32."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = top_p_filter(torch.softmax(logits / temperature, dim=-1), top_p)  # [B, V]
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for g, gen in enumerate(generators):
        rows = torch.tensor([r for r, k in enumerate(row_group) if k == g], device=logits.device)
        if len(rows):
            out[rows] = torch.multinomial(probs[rows], 1, generator=gen).squeeze(-1)
    return out


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    rows: list[list[int]],
    row_group: list[int],
    generators: list[torch.Generator],
    *,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    eos_ids: set[int],
    pad_id: int,
) -> SampleResult:
    """Sample a response for every prompt row, all rows in one batch, reusing the KV cache."""
    device = next(model.parameters()).device
    ids, mask = (t.to(device) for t in left_pad(rows, pad_id))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, T]; pads get 0, they are masked anyway
    eos = torch.tensor(sorted(eos_ids), device=device)
    done = torch.zeros(len(rows), dtype=torch.bool, device=device)  # [B]
    out_ids, out_lp = [], []
    past = None
    for _ in range(max_new_tokens):
        step = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=past, use_cache=True)
        past = step.past_key_values
        logits = step.logits[:, -1, :].float()  # [B, V]
        token = choose_tokens(logits, temperature, top_p, generators, row_group)  # [B]
        logp = behaviour_logprobs(logits, token, temperature, top_p)  # [B]
        out_ids.append(torch.where(done, pad_id, token))
        out_lp.append(logp)
        done = done | torch.isin(token, eos)
        if bool(done.all()):
            break
        ids = token[:, None]  # [B, 1]
        mask = torch.cat([mask, torch.ones_like(ids)], dim=1)  # [B, T + 1]; finished rows run on, unused
        positions = positions[:, -1:] + 1  # [B, 1]
    return _collect(torch.stack(out_ids, 1), torch.stack(out_lp, 1), eos_ids)


def _collect(ids: torch.Tensor, logps: torch.Tensor, eos_ids: set[int]) -> SampleResult:
    """Cut every row after its first eos. ids, logps: [B, steps]."""
    result = SampleResult([], [], [])
    for row_ids, row_lp in zip(ids.tolist(), logps.tolist(), strict=True):
        stop = next((i for i, t in enumerate(row_ids) if t in eos_ids), None)
        end = len(row_ids) if stop is None else stop + 1
        result.token_ids.append(row_ids[:end])
        result.logprobs.append(row_lp[:end])
        result.finished.append(stop is not None)
    return result
