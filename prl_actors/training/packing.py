"""Turning groups into model inputs, and the per-token log-probs of their responses.

Two layouts of one group (prompt p of length P, responses r_1..r_G of lengths L_i):

* packed (shared prompt): one row [p | r_1 | ... | r_G] of length T = P + sum(L_i). Boolean mask
  allowed[q, k]: prompt tokens are causal among themselves; a token of r_i sees the whole prompt and
  r_i's own past, never another response. Position ids: 0..P-1 for the prompt, and P..P+L_i-1 for
  every r_i (they restart at P). The prompt is computed once instead of G times.
* unpacked: G rows [p | r_i], right-padded, an ordinary 2D padding mask (the HF causal path).

Either way, r_i[0] is predicted by the logits at the last prompt position (index P-1) and r_i[j] by
the logits at r_i[j-1]; in the packed row every response's first token therefore reads position P-1.

A `ModelBatch` lists response tokens in the same order for both layouts (group, sample, position),
so their log-probs are comparable element-wise. Packed masks are fed to the model as 4D additive
float masks [B, 1, T, T] (0 = attend, -inf = not) with explicit position ids; padding positions of a
packed batch attend only to themselves, so no softmax row is empty (no NaN).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from prl_actors.model.block_attention import Blocks, build_blocks, dense_allowed, use_blocks
from prl_actors.training.behaviour import Behaviour, behaviour_logprobs


@dataclass
class ModelBatch:
    """Inputs of one forward pass plus where to read the response tokens' log-probs.

    input_ids, position_ids: [B, T]. attention_mask: [B, 1, T, T] float (packed), [B, T] long
    (unpacked), or None with `blocks` (the flat packed row of `collate_blocks`: B = 1, no dense
    mask; model/block_attention.py). predict_index: [N] flat index into the B*T logits of the
    position predicting each response token; targets: [N] those tokens; sample_index: [N] the sample
    (0..S-1, over the whole batch) each token belongs to. New per-token fields go after these, with
    defaults (positional construction stays valid); `to` moves every tensor-like field.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    predict_index: torch.Tensor
    targets: torch.Tensor
    sample_index: torch.Tensor
    blocks: Blocks | None = None
    lengths: tuple[list[int], list[list[int]]] | None = None  # with blocks: prompt / response lengths

    def to(self, device: torch.device | str) -> ModelBatch:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor | Blocks):
                moved[name] = value.to(device)
        return ModelBatch(**moved)


@dataclass
class PackedRow:
    """One packed group: token ids, position ids, boolean mask [T, T], and per response token the
    (row-local) predicting position and the token."""

    ids: list[int]
    positions: list[int]
    allowed: torch.Tensor
    predict: list[int]
    targets: list[int]


def pack_group(prompt: Sequence[int], responses: Sequence[Sequence[int]]) -> PackedRow:
    """The shared-prompt row of one group (see module docstring)."""
    n_prompt = len(prompt)
    if n_prompt == 0:
        raise ValueError("a group needs a non-empty prompt (the first response token is predicted from it)")
    total = n_prompt + sum(len(r) for r in responses)
    allowed = torch.zeros((total, total), dtype=torch.bool)  # [T, T]
    allowed[:n_prompt, :n_prompt] = torch.ones((n_prompt, n_prompt), dtype=torch.bool).tril()
    ids, positions = list(prompt), list(range(n_prompt))
    predict: list[int] = []
    start = n_prompt
    for resp in responses:
        n = len(resp)
        end = start + n
        allowed[start:end, :n_prompt] = True
        allowed[start:end, start:end] = torch.ones((n, n), dtype=torch.bool).tril()
        ids += list(resp)
        positions += range(n_prompt, n_prompt + n)
        predict += [n_prompt - 1, *range(start, end - 1)][:n]
        start = end
    targets = [t for resp in responses for t in resp]
    return PackedRow(ids, positions, allowed, predict, targets)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean allowed [..., T, T] -> additive float mask (0 where allowed, -inf elsewhere)."""
    zeros = torch.zeros(allowed.shape, dtype=dtype)
    return zeros.masked_fill(~allowed, float("-inf"))


def collate_packed(groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> ModelBatch:
    """One packed row per (prompt ids, responses) group, right-padded to the longest row."""
    packed = [pack_group(p, rs) for p, rs in groups]
    width = max(len(row.ids) for row in packed)
    n = len(packed)
    ids = torch.zeros((n, width), dtype=torch.long)  # [B, T]
    pos = torch.zeros((n, width), dtype=torch.long)  # [B, T]
    allowed = torch.eye(width, dtype=torch.bool).repeat(n, 1, 1)  # [B, T, T]; pads see themselves
    predict, targets = [], []
    for b, row in enumerate(packed):
        t = len(row.ids)
        ids[b, :t] = torch.tensor(row.ids)
        pos[b, :t] = torch.tensor(row.positions)
        allowed[b, :t, :t] = row.allowed
        predict += [b * width + i for i in row.predict]
        targets += row.targets
    return ModelBatch(
        ids,
        pos,
        additive_mask(allowed)[:, None],
        torch.tensor(predict, dtype=torch.long),
        torch.tensor(targets, dtype=torch.long),
        _sample_index(groups),
    )


def collate_blocks(groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> ModelBatch:
    """All groups back to back in one flat row [p_1 | r_11 .. r_1G | p_2 | ...] (B = 1, no padding),
    position ids as in `pack_group`, and the `Blocks` the "prl_blocks" attention reads instead of a
    dense mask. Same response-token order (and log-probs) as `collate_packed`."""
    if any(len(p) == 0 for p, _ in groups):
        raise ValueError("a group needs a non-empty prompt (the first response token is predicted from it)")
    ids: list[int] = []
    positions: list[int] = []
    predict: list[int] = []
    for prompt, responses in groups:
        start, n_prompt = len(ids), len(prompt)
        ids += prompt
        positions += range(n_prompt)
        for resp in responses:
            first = len(ids)
            ids += resp
            positions += range(n_prompt, n_prompt + len(resp))
            predict += [start + n_prompt - 1, *range(first, first + len(resp) - 1)][: len(resp)]
    lengths = ([len(p) for p, _ in groups], [[len(r) for r in rs] for _, rs in groups])
    return ModelBatch(
        torch.tensor([ids], dtype=torch.long),  # [1, N]
        torch.tensor([positions], dtype=torch.long),  # [1, N]
        None,
        torch.tensor(predict, dtype=torch.long),
        torch.tensor([t for _, rs in groups for r in rs for t in r], dtype=torch.long),
        _sample_index(groups),
        build_blocks(*lengths),
        lengths,
    )


def collate_unpacked(groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> ModelBatch:
    """One row [prompt | response] per sample, right-padded, with a 2D padding mask."""
    rows = [(list(p), list(r)) for p, rs in groups for r in rs]
    if any(len(p) == 0 for p, _ in rows):
        raise ValueError("a group needs a non-empty prompt (the first response token is predicted from it)")
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
    predict, targets = [], []
    for b, (p, r) in enumerate(rows):
        ids[b, : len(p) + len(r)] = torch.tensor(p + r)
        mask[b, : len(p) + len(r)] = 1
        predict += [b * width + len(p) - 1 + j for j in range(len(r))]
        targets += r
    pos = torch.arange(width).repeat(len(rows), 1)  # [B, T]
    return ModelBatch(
        ids,
        pos,
        mask,
        torch.tensor(predict, dtype=torch.long),
        torch.tensor(targets, dtype=torch.long),
        _sample_index(groups),
    )


def _sample_index(groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> torch.Tensor:
    """[N]: for each response token (group, sample, position order), its sample's batch index."""
    lengths = [len(r) for _, rs in groups for r in rs]
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths, dtype=torch.long))


DENSE_MAX_ROW = 256
"""Shared-prompt groups whose packed row is at most this long train on the dense-mask rows
(`collate_packed`): there attention is cheap and the blocks' gathers would cost more (measured:
demo shape, 16 groups of ~70 tokens: 24.6 ms dense vs 27.9 ms blocks per epoch on one thread); longer
rows take the flat block row (chat shape, ~870-token rows: 1.69 s dense vs 1.20 s blocks)."""


def collate(groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]], shared_prompt: bool) -> ModelBatch:
    """The trainer's batch: shared prompt -> the dense packed rows when every group's row is short
    (<= DENSE_MAX_ROW tokens), else the flat block-attention row; otherwise one row per sample.
    Both shared-prompt layouts give the same log-probs and gradients (tests/test_block_attention.py)."""
    if not shared_prompt:
        return collate_unpacked(groups)
    longest = max((len(p) + sum(len(r) for r in rs) for p, rs in groups), default=0)
    return collate_packed(groups) if longest <= DENSE_MAX_ROW else collate_blocks(groups)


def response_logprobs(
    model: torch.nn.Module,
    batch: ModelBatch,
    temperature: float | Behaviour = 1.0,
    top_p: float = 1.0,
    context: torch.Tensor | None = None,
) -> torch.Tensor:
    """log q(target) of every response token under the behaviour transform (training/behaviour.py:
    penalty, temperature, min_p, top_k, top-p), [N] float32 or wider (differentiable through `model`).
    `context` ([N, C], behaviour.response_contexts) is needed with a repetition penalty.
    Only the N predicting rows of the logits are transformed (cheap with large vocabularies)."""
    picked = response_logits(model, batch)  # [N, V]
    ctx = None if context is None else context.to(picked.device)
    return behaviour_logprobs(picked, batch.targets, temperature, top_p, ctx)  # [N]


def response_logits(model: torch.nn.Module, batch: ModelBatch) -> torch.Tensor:
    """The raw logits of the N rows that predict a response token, [N, V] (differentiable)."""
    extra: dict[str, object] = {}
    mask: torch.Tensor | dict[str, torch.Tensor] | None = batch.attention_mask
    if batch.blocks is not None and use_blocks(model):
        extra["prl_blocks"] = batch.blocks  # no dense mask: model/block_attention.py
        # an all-ones 2D mask: HF then builds no mask at all (with None it would detect the restarting
        # position ids as packed sequences and build a dense [N, N] one that nothing reads)
        mask = torch.ones_like(batch.input_ids)
    else:
        dense = batch.attention_mask
        if dense is None:  # a flat row for a model the blocks cannot serve: the same pattern, dense
            assert batch.lengths is not None, "a flat packed batch carries its lengths"
            dense = additive_mask(dense_allowed(*batch.lengths))[None, None].to(batch.input_ids.device)  # [1, 1, N, N]
        mask = dense
        if dense.dim() == 4:
            mask = with_sliding_window(model, dense.to(next(model.parameters()).dtype), batch.position_ids)
    flat = batch.input_ids.shape[0] == 1 and _keeps_logits(model)
    if flat:  # one flat row: the LM head runs on the N predicting positions only, not on every prompt
        extra["logits_to_keep"] = batch.predict_index  # token (with a 150k vocabulary it costs several layers)
    logits = model(
        input_ids=batch.input_ids, attention_mask=mask, position_ids=batch.position_ids, use_cache=False, **extra
    ).logits  # [1, N, V] (flat) or [B, T, V]
    return logits[0] if flat else logits.flatten(0, 1)[batch.predict_index]  # [N, V]


def _keeps_logits(model: torch.nn.Module) -> bool:
    """Does the model's forward take `logits_to_keep` (transformers' causal LMs; a PEFT wrapper passes
    its keyword arguments through to the one it wraps)?"""
    base = getattr(model, "get_base_model", None)
    inner: Any = base() if callable(base) else model
    cls: Any = type(inner)
    return _forward_keeps_logits(cls)


@functools.cache
def _forward_keeps_logits(cls: Any) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def with_sliding_window(
    model: torch.nn.Module, mask: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The packed 4D mask as `model` must get it. HF applies a sliding window (Mistral, Qwen2 with
    use_sliding_window, ...) only to masks it builds itself, never to a 4D mask given to it, so the
    window is applied here: query q may see key k only when pos(q) - pos(k) < window, distances in
    position ids as HF measures them in an unpacked row. Models mixing full and sliding layers get
    both masks by layer type. mask: [B, 1, T, T] additive; position_ids: [B, T]."""
    config = getattr(model, "config", None)
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or [])
    if not window or (types and "sliding_attention" not in types):
        return mask
    distance = position_ids[:, None, :, None] - position_ids[:, None, None, :]  # [B, 1, T, T]
    windowed = mask.masked_fill(distance >= window, float("-inf"))
    return {"full_attention": mask, "sliding_attention": windowed} if "full_attention" in types else windowed
