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

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from prl_actors.training.behaviour import Behaviour, behaviour_logprobs


@dataclass
class ModelBatch:
    """Inputs of one forward pass plus where to read the response tokens' log-probs.

    input_ids, position_ids: [B, T]. attention_mask: [B, 1, T, T] float (packed) or [B, T] long
    (unpacked). predict_index: [N] flat index into the B*T logits of the position predicting each
    response token; targets: [N] those tokens; sample_index: [N] the sample (0..S-1, over the whole
    batch) each token belongs to.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    predict_index: torch.Tensor
    targets: torch.Tensor
    sample_index: torch.Tensor

    def to(self, device: torch.device | str) -> ModelBatch:
        return ModelBatch(*(t.to(device) for t in vars(self).values()))


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


def collate(groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]], shared_prompt: bool) -> ModelBatch:
    return collate_packed(groups) if shared_prompt else collate_unpacked(groups)


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
    mask: torch.Tensor | dict[str, torch.Tensor] = batch.attention_mask
    if batch.attention_mask.dim() == 4:
        mask = with_sliding_window(model, batch.attention_mask.to(next(model.parameters()).dtype), batch.position_ids)
    logits = model(
        input_ids=batch.input_ids, attention_mask=mask, position_ids=batch.position_ids, use_cache=False
    ).logits  # [B, T, V]
    return logits.flatten(0, 1)[batch.predict_index]  # [N, V]


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
