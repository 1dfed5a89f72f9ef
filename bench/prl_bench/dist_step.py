"""Benchmark: the trainer's epoch (accumulate + the one step) vs trainer.world_size, gloo on CPU.

The real learners: world size 1 is `GRPOLearner` in this process; world size 2 is the
`DistributedLearner` the trainer actor runs (this process is rank 0 and starts rank 1 as a process,
as in a run), with strategy ddp and fsdp2. Every rank computes on one thread (trainer.threads = 1),
so world size N uses N cores. Groups are synthetic (random tokens and 0/1 rewards; the cost of a
group depends only on its lengths). Each case alternates its epochs with world size 1's (a shared
machine's load then hits both alike): one warm-up pair, then `epochs` timed pairs, medians. A last
ddp case flushes after every group, as the trainer does when groups arrive one by one, with varied
response lengths: each round then holds one group, which rank_learner.partition splits across the
ranks (whole groups would leave rank 1 idle).

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


def make_groups(
    n: int, group_size: int, prompt: int, response: int, vocab: int, seed: int, varied: bool = False
) -> list[Any]:
    """`n` groups of random tokens and 0/1 rewards; `varied`: response lengths geometric with mean
    `response`, capped at 4x (the chat shape's long tail), else all `response` long."""
    from prl_actors.protocol.messages import Group, Sample

    rng = random.Random(seed)

    def length() -> int:
        return min(4 * response, max(1, int(rng.expovariate(1 / response)))) if varied else response

    out = []
    for gid in range(n):
        samples = [
            Sample(
                text="",
                token_ids=[rng.randrange(3, vocab) for _ in range(length())],
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
    from prl_actors.launch import build

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
    return cfg, build.model_dir(cfg, ctx.work_dir)


def one_epoch(learner: Any, groups: list[Any], epoch: int, threads: int, per_flush: int = 0) -> float:
    """Seconds for one epoch (begin, accumulate every group, step) with `threads` torch threads here;
    `per_flush` > 0: a flush after every that many groups, as the trainer does when groups arrive one
    by one (a rank group trains each flush as one round)."""
    import torch

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    learner.begin_epoch(epoch, len(groups))
    for i, g in enumerate(groups, start=1):
        learner.accumulate(g)
        if per_flush and i % per_flush == 0:
            learner.flush()
    learner.step()
    return time.perf_counter() - t0


def paired(
    cfg: Any, model_dir: Path, groups: list[Any], epochs: int, strategy: str, threads: int, per_flush: int = 0
) -> dict[str, Any]:
    """Epochs of world size 1 (one thread) and of the other case, alternated (a shared machine's
    load then hits both alike); after one warm-up pair, the median time of each and of their ratio."""
    import torch

    from prl_actors.launch.topology import learner_settings
    from prl_actors.training.grpo import GRPOLearner

    before = torch.get_num_threads()
    trainer = cfg.trainer.model_copy(update={"world_size": 2 if strategy != "single" else 1, "strategy": strategy})
    other_cfg = cfg.model_copy(update={"trainer": trainer})
    base = GRPOLearner(learner_settings(cfg), model_dir)
    if strategy == "single":
        other: Any = GRPOLearner(learner_settings(other_cfg), model_dir)
    else:
        from prl_actors.launch.topology import start_trainer_group

        other = start_trainer_group(other_cfg, model_dir)
    pairs = []
    try:
        for e in range(epochs + 1):
            pairs.append((one_epoch(base, groups, e, 1, per_flush), one_epoch(other, groups, e, threads, per_flush)))
    finally:
        torch.set_num_threads(before)
        if strategy != "single":
            other.close()
    pairs = pairs[1:]
    return {
        "strategy": strategy,
        "world_size": trainer.world_size,
        "threads": threads,
        "per_flush": per_flush,
        "one_s": statistics.median(p[0] for p in pairs),
        "epoch_s": statistics.median(p[1] for p in pairs),
        "speedup": statistics.median(p[0] / p[1] for p in pairs),
        "pairs_s": [list(p) for p in pairs],
    }


def run(ctx: BenchContext) -> list[Entry]:
    cfg, model_dir = setup(ctx)
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    b, g, p, r = ctx.size((16, 8, 32, 48), (8, 8, 24, 32), (4, 2, 8, 4))
    epochs = ctx.size(3, 2, 1)
    groups = make_groups(b, g, p, r, vocab, seed=0)
    cores = len(os.sched_getaffinity(0))
    cases = [("single", min(2, cores)), ("ddp", 1), ("fsdp2", 1)]
    cases = ctx.size(cases, cases, [cases[1]])  # smoke: the structure, one group launch
    results = [paired(cfg, model_dir, groups, epochs, strategy, threads) for strategy, threads in cases]
    # groups arriving one by one, lengths varied (a round per group): whole groups leave rank 1 idle,
    # so each round's group is split across the ranks (rank_learner.partition)
    arriving = make_groups(b, g, p, r, vocab, seed=1, varied=True)
    results += [paired(cfg, model_dir, arriving, epochs, "ddp", 1, per_flush=1)]
    for res in results:
        what = f"{res['strategy']} x{res['world_size']} ({res['threads']} thread(s) each)"
        what += ", a round per arriving group (varied lengths)" if res["per_flush"] else ""
        ctx.say(f"  trainer epoch, {what}: {res['epoch_s']:.3f}s vs 1 process on 1 thread {res['one_s']:.3f}s")
    raw = {
        "cores": cores,
        "groups": b,
        "group_size": g,
        "prompt_tokens": p,
        "response_tokens": r,
        "hidden_size": cfg.model.hidden_size,
        "layers": cfg.model.layers,
        "table": [rounded(x) for x in results],
    }
    bound = float(min(2, cores))
    threaded = next((x for x in results if x["strategy"] == "single"), None)
    reference = f"; 1 process on {threaded['threads']} threads: {threaded['speedup']:.2f}x" if threaded else ""
    return [
        Entry(
            "dist_step",
            f"trainer epoch {res['strategy']} world_size 2{', a round per arriving group' if res['per_flush'] else ''}",
            "T(world size 1) / T(world size 2), one thread per rank, gloo; paired epochs, median",
            res["speedup"],
            "x",
            res["speedup"] / bound,
            0.8,
            ">=",
            bound,
            raw,
            note=f"bound = min(2 ranks, {cores} cores){reference}",
        )
        for res in results
        if res["strategy"] != "single"
    ]
