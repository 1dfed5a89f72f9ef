"""Prototypes, not product code: what a group's training costs when its samples' forwards run in pieces
(as they finish) instead of as one packed group, and whether the result stays exact. This is the
cost that decides whether sample-level forwards (docs/BENCHMARKS.md section 11; schedule_model.py)
would pay.

Three ways to forward a group's samples k at a time. Each puts every response token's log-prob in
the packed path's order. The gradient is one backward over all of them, as the group's loss would be:
* `reencoded`: [prompt | k responses] packed (training/packing.py), the prompt encoded again per call;
* `cached`: the prompt once, with its graph (Hugging Face `DynamicCache`); then each response alone
  against a copy of that cache;
* `prefix_blocks`: the prompt once, its keys and values kept per layer. Then k responses per call go
  through the trainer's own block attention (model/block_attention.py), with the prompt's row left
  out and its keys put in front of the responses' own.

    python -m prl_bench.sample_forwards
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from prl_actors.model.block_attention import Blocks, blocks_attention, build_blocks
from prl_actors.training.packing import collate, response_logits

PREFIX_IMPL = "prl_bench_prefix_blocks"
Forward = Callable[[torch.nn.Module, list[int], list[list[int]], int], torch.Tensor]


def _token_logprobs(logits: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """[n]: log-probs of `tokens` under `logits` ([n, V]), in float32 at least (float64 stays float64)."""
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.log_softmax(wide, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def packed(model: torch.nn.Module, prompt: list[int], responses: list[list[int]]) -> torch.Tensor:
    """[N]: the trainer's packed group (the reference)."""
    batch = collate([(prompt, responses)], True)
    return _token_logprobs(response_logits(model, batch), batch.targets.tolist())


def reencoded(model: torch.nn.Module, prompt: list[int], responses: list[list[int]], k: int) -> torch.Tensor:
    return torch.cat([packed(model, prompt, responses[c : c + k]) for c in range(0, len(responses), k)])


def cached(model: torch.nn.Module, prompt: list[int], responses: list[list[int]], k: int) -> torch.Tensor:
    """One response per call (k is not used: batching them needs padding, which costs more)."""
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    last, kv = out.logits[0, -1], out.past_key_values
    parts = []
    for r in responses:
        logits = last[None]
        if len(r) > 1:
            cache = DynamicCache()
            for i, layer in enumerate(kv.layers):
                cache.update(layer.keys, layer.values, i)  # the prompt's tensors, not copies: gradients reach them
            positions = torch.arange(len(prompt), len(prompt) + len(r) - 1)[None]
            step = model(
                input_ids=torch.tensor([r[:-1]]), past_key_values=cache, position_ids=positions, use_cache=True
            )
            logits = torch.cat([last[None], step.logits[0]])
        parts.append(_token_logprobs(logits, r))
    return torch.cat(parts)


def _prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    prl_blocks: Blocks | None = None,
    prl_prompt_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """blocks_attention with the prompt's keys and values ([1, H_kv, P, d] per layer) put in front of
    the flat row's own; the prompt's queries are zeros that no bucket reads."""
    if prl_prompt_kv is None:
        return blocks_attention(module, query, key, value, attention_mask, dropout, scaling, prl_blocks, **kwargs)
    pk, pv = prl_prompt_kv[module.layer_idx]  # type: ignore[index]
    pad = query.new_zeros(1, query.shape[1], pk.shape[2], query.shape[3])
    query, key, value = torch.cat([pad, query], 2), torch.cat([pk, key], 2), torch.cat([pv, value], 2)
    return blocks_attention(module, query, key, value, None, dropout, scaling, prl_blocks)


AttentionInterface.register(PREFIX_IMPL, _prefix_attention)
AttentionMaskInterface.register(PREFIX_IMPL, sdpa_mask)


def prefix_blocks(model: torch.nn.Module, prompt: list[int], responses: list[list[int]], k: int) -> torch.Tensor:
    config: Any = model.config
    before, config._attn_implementation = config._attn_implementation, PREFIX_IMPL
    try:
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        last, kept = out.logits[0, -1], [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        parts, p = [], len(prompt)
        for c in range(0, len(responses), k):
            chunk = responses[c : c + k]
            lens = [len(r) for r in chunk]
            full = build_blocks([p], [lens])  # [prompt | chunk]: drop the prompt's row (its output comes first)
            blocks = Blocks(full.buckets[1:], full.back[p:] - full.buckets[0].queries.numel())
            ids = torch.tensor([[t for r in chunk for t in r]])
            starts = [sum(lens[:i]) for i in range(len(lens))]
            keep = torch.tensor(
                [s + j for s, n in zip(starts, lens, strict=True) for j in range(n - 1)], dtype=torch.long
            )
            logits = model(
                input_ids=ids,
                position_ids=torch.tensor([[p + j for n in lens for j in range(n)]]),
                attention_mask=torch.ones_like(ids),
                use_cache=False,
                prl_blocks=blocks,
                prl_prompt_kv=kept,
                logits_to_keep=keep,
            ).logits[0]
            row = 0
            for r in chunk:
                parts.append(_token_logprobs(torch.cat([last[None], logits[row : row + len(r) - 1]]), r))
                row += len(r) - 1
        return torch.cat(parts)
    finally:
        config._attn_implementation = before


WAYS: dict[str, Forward] = {"reencoded": reencoded, "cached": cached, "prefix_blocks": prefix_blocks}


def train_seconds(tri: Any, groups: list[Any], way: Forward | None, k: int) -> float:
    """One pass over `groups`: the policy's log-probs (graph kept), the reference's, one backward each."""

    def logprobs(model: torch.nn.Module, prompt: list[int], responses: list[list[int]]) -> torch.Tensor:
        return packed(model, prompt, responses) if way is None else way(model, prompt, responses, k)

    t0 = time.perf_counter()
    for g in groups:
        prompt, responses = list(g.prompt_ids), [list(s.token_ids) for s in g.samples]
        tri.policy.zero_grad(set_to_none=True)
        logp = logprobs(tri.policy, prompt, responses)
        with torch.no_grad():
            ref = logprobs(tri.reference, prompt, responses)
        (logp - ref).sum().backward()
    return time.perf_counter() - t0


def main(argv: list[str]) -> None:
    from prl_actors.config import load_config
    from prl_bench.chat_shape import build_chat_model, chat_settings
    from prl_bench.e2e import Loop

    shape = argv[0] if argv else "chat-h128-L4"
    torch.set_num_threads(1)
    model_dir = build_chat_model(shape, Path(f"/tmp/prl-sample-forwards/{shape}"))
    loop = Loop(load_config(None, {**chat_settings(8, 256), "model.path": str(model_dir)}), model_dir)
    groups = loop.generate(0)
    for g in groups:  # samples done at the same moment have about the same length
        g.samples.sort(key=lambda s: len(s.token_ids))
    tri = loop.learner.tri
    print(f"{shape}, one thread, 8 groups x 8 samples: seconds for the policy's and reference's forwards + backward")
    for _ in range(2):
        base = train_seconds(tri, groups, None, 8)
        cells = [f"packed {base:.3f}"]
        for name, way in WAYS.items():
            for k in (1, 2, 4, 8) if name != "cached" else (1,):
                cells.append(f"{name} {k}/call {train_seconds(tri, groups, way, k) / base:.2f}x")
        print(" | ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1:])
