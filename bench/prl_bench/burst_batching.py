"""Benchmark: what `train_group.generated` saves the trainer on any hardware (docs/PROTOCOL.md).

A worker's burst of B groups reaches the trainer one by one. Knowing that the rest is on its way
(`generated`), the trainer trains the burst in micro-batches as large as its budget allows; not
knowing it, it flushes the first group alone and the rest after (one forward/backward more). This
measures both orders on the same learner and the same groups (the e2e settings: B = 16, G = 8, 8 new
tokens), in one process on one torch thread, interleaved rep by rep. Reported: CPU seconds of the
accumulate + flush work (robust to other load on the host, unlike wall time), median per order, and
the median of the per-rep savings. The 2-core hand-over's share (the trainer taking every core at the
burst's first group) is not in this number: it is in the e2e benchmark.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from prl_bench.common import BenchContext, Entry, rounded
from prl_bench.e2e import Loop, _config, prepare, settings

ORDERS = ("together", "first_alone")


def measure(ctx: BenchContext, shape: str, reps: int) -> dict[str, Any]:
    """CPU seconds per order (median over `reps`, the orders alternating) and the per-rep savings."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(ctx, shape, reps)
    finally:
        torch.set_num_threads(before)  # the suite's other benchmarks run in this process too


def _measure(ctx: BenchContext, shape: str, reps: int) -> dict[str, Any]:
    model_dir = prepare(ctx, shape)
    cfg = _config({**settings(ctx, shape), "model.path": str(model_dir), "run.run_dir": str(ctx.work_dir / "burst")})
    loop = Loop(cfg, model_dir)
    groups = loop.generate(0)
    learner = loop.learner
    cpu: dict[str, list[float]] = {order: [] for order in ORDERS}
    for r in range(reps):
        for order in ORDERS if r % 2 == 0 else ORDERS[::-1]:
            learner.begin_epoch(learner.version, len(groups))
            c0 = time.process_time()
            for i, g in enumerate(groups):
                learner.accumulate(g)
                if order == "first_alone" and i == 0:
                    learner.flush()  # not knowing the rest is on its way: the first group alone
            learner.flush()
            cpu[order].append(time.process_time() - c0)
            learner.step()
    saved = [a - b for a, b in zip(cpu["first_alone"], cpu["together"], strict=True)]
    return {
        "groups": len(groups),
        "together_cpu_s": statistics.median(cpu["together"]),
        "first_alone_cpu_s": statistics.median(cpu["first_alone"]),
        "saved_cpu_s": statistics.median(saved),
        "saved_min_s": min(saved),
        "saved_max_s": max(saved),
        "reps": reps,
    }


def run(ctx: BenchContext) -> list[Entry]:
    entries = []
    for shape in ctx.size(["demo", "h128-L4", "h512-L8"], ["demo", "h128-L4"], ["demo"]):
        got = measure(ctx, shape, ctx.size(9, 5, 2))
        ctx.say(
            f"  burst_batching {shape}: together {got['together_cpu_s']:.4f} s, "
            f"first alone {got['first_alone_cpu_s']:.4f} s (CPU, one thread)"
        )
        ratio = got["first_alone_cpu_s"] / max(got["together_cpu_s"], 1e-9)
        entries.append(
            Entry(
                benchmark="burst_batching",
                name=shape,
                metric="CPU s to train a burst of the epoch knowing it is generated; ratio = first alone / together",
                measured=round(max(got["together_cpu_s"], 1e-6), 6),
                unit="s",
                ratio=round(ratio, 4),
                goal=None,
                raw=rounded({"shape": shape, **got}, 6),
            )
        )
    return entries
