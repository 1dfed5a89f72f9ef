"""Shared-prompt attention without a dense mask: the "prl_blocks" attention implementation.

A packed micro-batch (training/packing.py, `collate_blocks`) is one flat row of N tokens holding,
group after group, [p | r_1 | ... | r_G]. Token q of r_i must see the whole prompt p and r_i's own
past, never another response; prompt tokens are causal among themselves. A dense [N, N] mask makes
SDPA run over all N x N pairs (most of them masked out: with G = 8 responses a response token
"computes" ~8x the keys it may see), and on CPU a masked kernel cannot skip any block.

Here the linear layers (most of the FLOPs) still run once per prompt token, and attention runs on
*rows* gathered from the flat q/k/v: one prompt row per group, [p_g] attending to itself with plain
causal SDPA (`is_causal=True`, no mask), and one response row per sample, whose queries are r_s only
and whose keys are [p_g | r_s], query i seeing keys up to |p_g| + i (a causal mask aligned at the
bottom right, `Bucket.mask`). Together these are exactly the pairs the dense mask allows, and the
prompt's queries are computed once per group, not once per sample (they were P^2/2 of each row's
P^2/2 + L(P + L/2) pairs: at the chat shape, P ~ 165 and L ~ 80, that removed 65% of the attention
time, BENCHMARKS §11). Rows of each kind are sorted by size and batched in buckets whose padded area
stays under ~10% of the real one (`BUCKET_SLACK`); padded keys sit after every real key and padded
queries are never read back. Each token's output is read back from its own row with one gather.

The prompt's keys/values enter every response row of the group by indexing, so each response's
loss reaches the prompt positions through them: gradients equal the dense path's (tests).

The implementation is registered with transformers as "prl_blocks" (attention and mask functions).
Without a `prl_blocks` keyword (generation, an unpacked batch, a dense 4D mask) it *is* SDPA, so a
model switched to it (`use_blocks`) behaves exactly as before everywhere else. The engine's decode
steps pass `prl_prefix` instead: one prompt per group held once (model/prefix_attention.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from prl_actors.model.prefix_attention import PrefixKV, prefix_attention

NAME = "prl_blocks"
BUCKET_SLACK = 1.1
"""A bucket of rows grows while its padded area stays <= BUCKET_SLACK x its real tokens."""
MASK_MAX = 1 << 26
"""A response bucket whose mask would hold more elements than this (64 MB of bools: very long rows in
one micro-batch) runs as whole causal rows [p_g | r_s] instead: no mask, the prompt's queries again."""


@dataclass
class Bucket:
    """Rows of equal padded shape. A row's queries are the last n of its keys: a prompt row is [p_g]
    attending to itself (square, causal); a response row's queries are r_s and its keys [p_g | r_s],
    query i seeing keys up to |p_g| + i (causal aligned at the bottom right).

    queries: [rows, Lq] and keys: [rows, Lk] flat positions (padding: 0); mask: [rows, 1, Lq, Lk] bool,
    or None for square causal rows (plain `is_causal`, no mask): the prompts, and response rows run as
    whole rows [p_g | r_s] when their mask would exceed MASK_MAX (queries is keys then)."""

    queries: torch.Tensor
    keys: torch.Tensor
    mask: torch.Tensor | None

    def to(self, device: torch.device | str) -> Bucket:
        mask = None if self.mask is None else self.mask.to(device)
        return Bucket(self.queries.to(device), self.keys.to(device), mask)


@dataclass
class Blocks:
    """The rows of a flat packed row, bucketed; back: [N] for each flat position, where its attention
    output is read back from in cat(bucket outputs, each flattened to [rows * Lq])."""

    buckets: list[Bucket]
    back: torch.Tensor

    def to(self, device: torch.device | str) -> Blocks:
        return Blocks([b.to(device) for b in self.buckets], self.back.to(device))


def build_blocks(prompt_lens: list[int], response_lens: list[list[int]]) -> Blocks:
    """The Blocks of groups laid out back to back as [p | r_1 | ... | r_G] (lengths only): one prompt
    row per group, one response row per non-empty sample."""
    prompts: list[tuple[list[int], int]] = []  # (key positions, queries: the last n of them)
    responses: list[tuple[list[int], int]] = []
    start = 0
    for p, ls in zip(prompt_lens, response_lens, strict=True):
        prompt = list(range(start, start + p))
        prompts.append((prompt, p))
        start += p
        for n in ls:
            if n:
                responses.append((prompt + list(range(start, start + n)), n))
            start += n
    back = torch.zeros(start, dtype=torch.long)  # [N]
    buckets: list[Bucket] = []
    base = 0
    for rows, square in ((prompts, True), (responses, False)):
        order = sorted(range(len(rows)), key=lambda r: (len(rows[r][0]), rows[r][1]))
        for members in _buckets([(rows[r][1], len(rows[r][0])) for r in order]):
            chosen = [rows[order[m]] for m in members]
            lq, lk = max(n for _, n in chosen), max(len(k) for k, _ in chosen)
            keys = torch.zeros((len(chosen), lk), dtype=torch.long)  # [rows, Lk]
            for i, (k, _) in enumerate(chosen):
                keys[i, : len(k)] = torch.tensor(k, dtype=torch.long)
            offsets = torch.tensor([len(k) - n for k, n in chosen], dtype=torch.long)  # keys before the queries
            # prompt rows are square; a response bucket whose mask would pass MASK_MAX runs as whole causal
            # rows [p_g | r_s] (the prompt's queries again, only r_s read back): either way no mask
            queries, mask = keys, None
            if not square and len(chosen) * lq * lk <= MASK_MAX:  # queries r_s only
                queries = torch.zeros((len(chosen), lq), dtype=torch.long)  # [rows, Lq]
                for i, (k, n) in enumerate(chosen):
                    queries[i, :n] = keys[i, len(k) - n : len(k)]
                # query i sees keys j <= offset + i (padded queries see key 0 at least; never read back)
                mask = torch.arange(lk)[None, None, :] <= offsets[:, None, None] + torch.arange(lq)[None, :, None]
                mask = mask[:, None]  # [rows, 1, Lq, Lk]
            width = queries.shape[1]
            for i, (k, n) in enumerate(chosen):  # each query's output: row i, column (offset if whole) + j
                first = int(offsets[i]) if queries is keys else 0
                back[keys[i, len(k) - n : len(k)]] = base + i * width + first + torch.arange(n)
            buckets.append(Bucket(queries, keys, mask))
            base += queries.numel()
    return Blocks(buckets, back)


def _buckets(shapes: list[tuple[int, int]]) -> list[list[int]]:
    """Split rows (their (Lq, Lk), sorted by Lk ascending) into runs whose padded area (rows x the
    largest Lq x the largest Lk) stays <= BUCKET_SLACK x their real area. Returns indices into shapes."""
    out: list[list[int]] = []
    real, widest = 0, 0
    for r, (q, k) in enumerate(shapes):
        if out and (len(out[-1]) + 1) * max(widest, q) * k <= BUCKET_SLACK * (real + q * k):
            out[-1].append(r)
            real, widest = real + q * k, max(widest, q)
        else:
            out.append([r])
            real, widest = q * k, q
    return out


def dense_allowed(prompt_lens: list[int], response_lens: list[list[int]]) -> torch.Tensor:
    """[N, N] bool: the same attention pattern as one dense mask over the flat row (the reference,
    and the path for models the blocks cannot serve, e.g. sliding windows)."""
    group, sample = [], []  # per flat token: its group, and its sample (-1 for prompt tokens)
    s = 0
    for g, (p, ls) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        group += [g] * p
        sample += [-1] * p
        for n in ls:
            group += [g] * n
            sample += [s] * n
            s += 1
    gr, sa = torch.tensor(group), torch.tensor(sample)  # [N] each
    n = gr.numel()
    causal = torch.ones((n, n), dtype=torch.bool).tril()
    same_group = gr[:, None] == gr[None, :]
    visible = (sa[None, :] == -1) | (sa[:, None] == sa[None, :])  # key is a prompt token, or my own sample's
    return causal & same_group & visible


def blocks_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    prl_blocks: Blocks | None = None,
    prl_prefix: PrefixKV | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention interface of transformers. query: [1, H, N, d]; key, value: [1, H_kv, N, d];
    returns [1, N, H, d]. With `prl_prefix` instead: a decode step over a shared-prefix store
    (model/prefix_attention.py). Without either: SDPA, unchanged."""
    if prl_prefix is not None:
        return prefix_attention(module, query, key, value, prl_prefix, scaling)
    if prl_blocks is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)  # type: ignore[no-any-return]
    if query.shape[0] != 1 or kwargs.get("sliding_window"):
        raise ValueError("prl_blocks attention takes one flat packed row and no sliding window")
    n_rep = query.shape[1] // key.shape[1]
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [N, H(kv), d]
    if n_rep > 1:
        k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)  # [N, H, d]
    outs = []
    for b in prl_blocks.buckets:
        kb, vb = (t[b.keys].transpose(1, 2) for t in (k, v))  # [rows, H, Lk, d]
        if b.mask is None:  # square causal rows (the prompts)
            ob = F.scaled_dot_product_attention(q[b.keys].transpose(1, 2), kb, vb, is_causal=True, scale=scaling)
        else:
            ob = F.scaled_dot_product_attention(q[b.queries].transpose(1, 2), kb, vb, attn_mask=b.mask, scale=scaling)
        outs.append(ob.transpose(1, 2).flatten(0, 1))  # [rows * Lq, H, d]
    return torch.cat(outs)[prl_blocks.back][None], None  # [1, N, H, d]


AttentionInterface.register(NAME, blocks_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_blocks(model: torch.nn.Module) -> bool:
    """Switch `model` (an SDPA model without sliding-window layers) to "prl_blocks" once; True when
    it runs on it. Other models (eager attention, sliding windows) keep their dense-mask path."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    impl = getattr(config, "_attn_implementation", None)
    if impl == NAME:
        return True
    if impl != "sdpa" or _has_sliding_window(config):
        return False
    config._attn_implementation = NAME
    return True


def _has_sliding_window(config: Any) -> bool:
    """The same test as packing.with_sliding_window: a window applies to some layer."""
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or [])
    return bool(window) and (not types or "sliding_attention" in types)
