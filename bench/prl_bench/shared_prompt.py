"""Benchmark 2: shared-prompt attention (packing.py) vs one row per sample, forward + backward.

A group is a prompt of P tokens and G responses of R tokens. Unpacked, the model sees G rows of
P + R tokens; packed, one row [P | r_1 .. r_G] of P + G*R tokens with a 4D mask. The work that scales
with tokens (every linear layer, the LM head) shrinks by the bound G(P+R) / (P+G*R); attention is
computed densely over the packed row (the mask hides, it does not skip), so its share shrinks less.

Measured: training tokens/s (the unpacked token count G(P+R) per second, for both layouts, so the
ratio is the speed-up) of `response_logprobs(model, batch).sum().backward()` on a Qwen2 model shaped
like the built-in tiny LM, and on a slightly larger one; the collate time (building the mask) is
timed apart and reported, and included in the end-to-end ratio. The max |logp_packed - logp_unpacked|
shows both layouts compute the same thing.

A second bound counts multiply-adds with attention computed densely (what an explicit 4D mask costs;
a varlen / block-sparse kernel would skip the masked blocks): per row of T tokens and L layers,
T * (L * (16 h^2 + 2 T h) + h V). It explains the tiny model, whose attention over the packed row
costs as much as all its linear layers.

Torch runs with one intra-op thread: on a shared 2-core machine OpenMP threads that spin-wait for
a busy sibling core make timings swing by 10-50x (measured); one thread gives repeatable numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prl_bench.common import BenchContext, Entry, rounded


@dataclass
class ModelShape:
    name: str
    hidden: int
    layers: int
    heads: int
    vocab: int


TINY = ModelShape("tiny", 64, 2, 4, 18)  # the built-in LM's defaults (char vocabulary)
SMALL = ModelShape("small", 256, 4, 8, 4096)


def make_model(shape: ModelShape, seed: int = 0):  # type: ignore[no-untyped-def]
    """A randomly initialised Qwen2 causal LM (the built-in model's architecture), sdpa attention."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    kwargs: dict[str, Any] = dict(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=4 * shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(Qwen2Config(**kwargs)).eval()


def dense_macs(shape: ModelShape, rows: int, tokens: int) -> float:
    """Forward multiply-adds of `rows` rows of `tokens` tokens, attention computed densely."""
    h, layers = shape.hidden, shape.layers
    return rows * tokens * (layers * (16 * h * h + 2 * tokens * h) + h * shape.vocab)


def make_group(g: int, p: int, r: int, vocab: int, seed: int = 0) -> tuple[list[int], list[list[int]]]:
    import random

    rng = random.Random(seed)
    prompt = [rng.randrange(4, vocab) for _ in range(p)]
    return prompt, [[rng.randrange(4, vocab) for _ in range(r)] for _ in range(g)]


def _fwd_bwd_s(model, batch, repeats: int) -> float:  # type: ignore[no-untyped-def]
    import time

    from prl_actors.training.packing import response_logprobs

    best = float("inf")
    for i in range(repeats + 1):  # the first call warms up (allocations, kernel choice)
        t0 = time.perf_counter()
        response_logprobs(model, batch).sum().backward()
        dt = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
        if i:
            best = min(best, dt)
    return best


def _collate_s(groups: list[Any], shared: bool, repeats: int) -> float:
    import time

    from prl_actors.training.packing import collate

    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        collate(groups, shared)
        best = min(best, time.perf_counter() - t0)
    return best


def max_logprob_diff(model, groups: list) -> float:  # type: ignore[no-untyped-def,type-arg]
    import torch

    from prl_actors.training.packing import collate, response_logprobs

    with torch.no_grad():
        packed = response_logprobs(model, collate(groups, True))
        unpacked = response_logprobs(model, collate(groups, False))
    return float((packed - unpacked).abs().max())


def measure(model, shape: ModelShape, g: int, p: int, r: int, repeats: int) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """One (G, P, R) point: both layouts, timings, bound, logprob agreement."""
    from prl_actors.training.packing import collate

    groups = [make_group(g, p, r, shape.vocab)]
    t_packed = _fwd_bwd_s(model, collate(groups, True), repeats)
    t_unpacked = _fwd_bwd_s(model, collate(groups, False), repeats)
    c_packed, c_unpacked = _collate_s(groups, True, repeats), _collate_s(groups, False, repeats)
    logical = g * (p + r)
    bound = logical / (p + g * r)
    flop_bound = dense_macs(shape, g, p + r) / dense_macs(shape, 1, p + g * r)
    speedup = t_unpacked / t_packed
    e2e = (t_unpacked + c_unpacked) / (t_packed + c_packed)
    return rounded(
        {
            "model": shape.name,
            "G": g,
            "P": p,
            "R": r,
            "tokens_packed": p + g * r,
            "tokens_unpacked": logical,
            "fwd_bwd_packed_s": t_packed,
            "fwd_bwd_unpacked_s": t_unpacked,
            "collate_packed_s": c_packed,
            "collate_unpacked_s": c_unpacked,
            "tokens_per_s_packed": logical / (t_packed + c_packed),
            "tokens_per_s_unpacked": logical / (t_unpacked + c_unpacked),
            "speedup_model": speedup,
            "speedup": e2e,
            "bound": bound,
            "of_bound": e2e / bound,
            "dense_attention_bound": flop_bound,
            "of_dense_attention_bound": e2e / flop_bound,
            "max_logprob_diff": max_logprob_diff(model, groups),
        },
        7,
    )


def run(ctx: BenchContext) -> list[Entry]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(ctx)
    finally:
        torch.set_num_threads(threads)


def _run(ctx: BenchContext) -> list[Entry]:
    repeats = ctx.size(3, 2, 1)
    main_g, main_p, main_r = ctx.size((8, 256, 64), (8, 256, 64), (4, 32, 8))
    entries = []
    for shape in ctx.size([TINY, SMALL], [TINY, SMALL], [TINY]):
        model = make_model(shape)
        row = measure(model, shape, main_g, main_p, main_r, repeats)
        ctx.say(
            f"  shared prompt {shape.name:<5} G={main_g} P={main_p} R={main_r}: speedup {row['speedup']:.2f} "
            f"(model only {row['speedup_model']:.2f}) bound {row['bound']:.2f}, max dlogp {row['max_logprob_diff']:.1e}"
        )
        points = _sweep_points(ctx, shape, main_g, main_p)
        sweep = [row if (g, p) == (main_g, main_p) else measure(model, shape, g, p, main_r, repeats) for g, p in points]
        entry = _entry(row)
        entry.raw.update(sweep=sweep, torch_threads=1)
        entries.append(entry)
    return entries


def _sweep_points(ctx: BenchContext, shape: ModelShape, main_g: int, main_p: int) -> list[tuple[int, int]]:
    """G sweep at the main P, P sweep at the main G (the quick preset sweeps the tiny model only)."""
    if ctx.quick and shape is not TINY:
        return []
    gs = ctx.size([1, 2, 4, 8, 16], [2, 4, 8, 16], [2])
    ps = ctx.size([32, 64, 128, 256, 512, 1024], [64, 256, 1024], [16])
    return list(dict.fromkeys([(g, main_p) for g in gs] + [(main_g, p) for p in ps]))


def _entry(row: dict[str, Any]) -> Entry:
    return Entry(
        benchmark="shared_prompt",
        name=f"shared prompt {row['model']} G={row['G']} P={row['P']} R={row['R']}",
        metric="training tokens/s packed / unpacked, as a fraction of G(P+R)/(P+G*R)",
        measured=row["speedup"],
        unit="x",
        ratio=row["of_bound"],
        goal=0.8,
        bound=row["bound"],
        raw=dict(row),
        note=(
            f"max |logp diff| {row['max_logprob_diff']:.1e}; dense-attention bound {row['dense_attention_bound']:.2f} "
            f"({row['of_dense_attention_bound']:.2f} of it)"
        ),
    )
