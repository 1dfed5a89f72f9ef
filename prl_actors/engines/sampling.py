"""Sampling helpers shared by the engines: stable seeds, left padding, the top-p filter.

The running batch (engines/batching.py) draws tokens with them; the log-prob of every drawn token is
`training.behaviour.behaviour_logprobs`, the very function the trainer scores tokens with.
"""

from __future__ import annotations

import hashlib

import torch

from prl_actors.training.behaviour import nucleus_mask


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
    always kept; the set of `nucleus_mask`); rows are not renormalised (an inverse-CDF draw does not
    need it). probs: [B, V]."""
    if top_p >= 1.0:
        return probs
    return probs.masked_fill(~nucleus_mask(probs, top_p), 0.0)
