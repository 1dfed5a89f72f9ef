"""Benchmark: the trainer's epoch (accumulate + the one step) vs trainer.world_size, gloo on CPU.

The real learners: world size 1 is `GRPOLearner` in this process; world size 2 is the
`DistributedLearner` the trainer actor runs (this process is rank 0 and starts rank 1 as a process,
as in a run), with strategy ddp and fsdp2. Every rank computes on one thread (trainer.threads = 1),
so world size N uses N cores. Groups are synthetic (random tokens and 0/1 rewards; the cost of a
group depends only on its lengths). Each case trains a warm-up epoch, then `epochs` timed ones.

Bound: speed-up T(1) / T(N) <= min(N, cores) (the ranks' compute in parallel; the collectives and
rank 0's commands are the overhead the ratio shows). Reference: world size 1 on min(2, cores)
threads (what intra-op threading gets from the same cores).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from prl_bench.common import BenchContext, Entry, rounded


def make_groups(n: int, group_size: int, prompt: int, response: int, vocab: int, seed: int) -> list[Any]:
    from prl_actors.protocol.messages import Group, Sample

    rng = random.Random(seed)
    out = []
    for gid in range(n):
        samples = [
            Sample(
                text="",
                token_ids=[rng.randrange(3, vocab) for _ in range(response)],
                logprobs=[],
                reward=float(rng.random() < 0.5),
                finished=True,
            )
            for _ in range(group_size)
        ]
        ids = [rng.randrange(3, vocab) for _ in range(prompt)]
        out.append(Group(group_id=gid, prompt="", prompt_ids=ids, samples=samples, worker="bench"))
    return out


def setup(ctx: BenchContext) -> tuple[Any, Path]:
    from prl_actors.config import load_config
    from prl_actors.model.builtin import prepare_model

    size = ctx.size((256, 4, 8), (128, 2, 4), (32, 2, 4))
    cfg = load_config(
        None,
        {
            "run.run_dir": str(ctx.work_dir),
            "model.hidden_size": size[0],
            "model.layers": size[1],
            "model.heads": size[2],
            "model.warm_start_steps": 0,
            "trainer.threads": 1,
            "trainer.max_grad_norm": 1e6,
        },
    )
    return cfg, prepare_model(cfg, ctx.work_dir)


def time_epochs(learner: Any, groups: list[Any], epochs: int) -> list[float]:
    """Seconds per epoch (begin, accumulate every group, step), after one warm-up epoch."""
    times = []
    for e in range(epochs + 1):
        t0 = time.perf_counter()
        learner.begin_epoch(e, len(groups))
        for g in groups:
            learner.accumulate(g)
        learner.step()
        times.append(time.perf_counter() - t0)
    return times[1:]


def one_case(cfg: Any, model_dir: Path, groups: list[Any], epochs: int, case: tuple[str, int, int]) -> dict[str, Any]:
    """(strategy, world size, threads per rank): its median epoch time."""
    import torch

    strategy, world_size, threads = case
    trainer = cfg.trainer.model_copy(update={"world_size": world_size, "strategy": strategy, "threads": threads})
    cfg = cfg.model_copy(update={"trainer": trainer})
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if strategy == "single":
            from prl_actors.training.grpo import GRPOLearner

            times = time_epochs(GRPOLearner(cfg, model_dir), groups, epochs)
        else:
            from prl_actors.training.distributed import start_distributed

            learner = start_distributed(cfg, model_dir)
            try:
                times = time_epochs(learner, groups, epochs)
            finally:
                learner.close()
    finally:
        torch.set_num_threads(before)
    median = statistics.median(times)
    return {"world_size": world_size, "strategy": strategy, "threads": threads, "epoch_s": median, "all_s": times}


def run(ctx: BenchContext) -> list[Entry]:
    cfg, model_dir = setup(ctx)
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    b, g, p, r = ctx.size((16, 8, 32, 48), (8, 8, 24, 32), (4, 2, 8, 4))
    epochs = ctx.size(3, 2, 1)
    groups = make_groups(b, g, p, r, vocab, seed=0)
    cores = len(os.sched_getaffinity(0))
    cases = [("single", 1, 1), ("single", 1, min(2, cores)), ("ddp", 2, 1), ("fsdp2", 2, 1)]
    cases = ctx.size(cases, cases, [cases[0], cases[0], cases[2]])  # smoke: the structure, one group launch
    results = [one_case(cfg, model_dir, groups, epochs, case) for case in cases]
    one = results[0]["epoch_s"]
    for res in results:
        what = f"{res['strategy']} x{res['world_size']} ({res['threads']} thread(s) each)"
        ctx.say(f"  trainer epoch, {what}: {res['epoch_s']:.3f}s")
    raw = {
        "cores": cores,
        "groups": b,
        "group_size": g,
        "prompt_tokens": p,
        "response_tokens": r,
        "hidden_size": cfg.model.hidden_size,
        "layers": cfg.model.layers,
        "table": [rounded({**x, "speedup": one / x["epoch_s"]}) for x in results],
    }
    bound = float(min(2, cores))
    entries = []
    for res in results[2:]:
        speedup = one / res["epoch_s"]
        entries.append(
            Entry(
                "dist_step",
                f"trainer epoch {res['strategy']} world_size 2",
                "T(world size 1) / T(world size 2), one thread per rank, gloo",
                speedup,
                "x",
                speedup / bound,
                0.8,
                ">=",
                bound,
                raw,
                note=f"1 thread x 2 ranks vs 1 thread; 1 process on {results[1]['threads']} threads: "
                f"{one / results[1]['epoch_s']:.2f}x",
            )
        )
    return entries
