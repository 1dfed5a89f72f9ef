"""Benchmark: bounded staleness (run.mode bounded, k = 1, 2) against sync, periodic and the
single-process loop, at equal work.

Each case runs `prl-actors up` (one worker, the e2e settings) in sync, periodic, bounded k = 1 and
bounded k = 2 (trainer.is_correction tis), and the single-process loop of the e2e benchmark (the
faster of one thread and every core). Reported per case: samples/s over the whole run, E epochs'
samples over the time from epoch 0's open to the last optimizer step (bounded mode generates epochs
ahead, so a window between optimizer steps would leave their generation out), against the loop's E
iterations (the first included in both), and the reward curve (reward_mean per epoch). Shapes: demo,
h128-L4 (random init: responses run to max_new_tokens) and a generation-heavy setting (h128-L4 with
4x the response length). Bounded mode pays only where generation of epoch e+1 can overlap training
of epoch e on free cores; on a loaded 2-core host both compete for the same cores.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from prl_bench.common import BenchContext, Entry, free_port, rounded, run_up
from prl_bench.e2e import measure_loop, prepare, settings

CASES = (("sync", 0), ("periodic", 0), ("bounded", 1), ("bounded", 2))


def shape_settings(ctx: BenchContext, case: str) -> tuple[str, dict[str, Any]]:
    """(model shape, overrides) of a case: demo, h128-L4, or gen-heavy (h128-L4, long responses)."""
    if case == "gen-heavy":
        return "h128-L4", {**settings(ctx, "h128-L4"), "worker.sampling.max_new_tokens": ctx.size(32, 32, 12)}
    return case, settings(ctx, case)


def label(mode: str, k: int) -> str:
    return f"bounded_k{k}" if mode == "bounded" else mode


def measure(ctx: BenchContext, case: str, model_dir: Path, mode: str, k: int, epochs: int) -> dict[str, Any]:
    from prl_actors.replay.events import load_run

    _, overrides = shape_settings(ctx, case)
    run_dir = ctx.work_dir / f"bounded-{case}-{label(mode, k)}"
    cmd = [sys.executable, "-m", "cli.main", "up", "--run-dir", str(run_dir), "--workers", "1", "--epochs", str(epochs)]
    sets = {
        **overrides,
        "model.path": str(model_dir),
        "transport.base_port": free_port(5),
        "transport.auth": ctx.auth,
        "run.mode": mode,
        "run.max_staleness": k,
        "trainer.is_correction": "tis" if k else "none",
    }
    for key, v in sets.items():
        cmd += ["--set", f"{key}={v}"]
    code, err = run_up(cmd, timeout_s=1800.0)
    if code != 0:
        raise RuntimeError(f"prl-actors up ({case}, {label(mode, k)}) failed ({code}): {err[-1500:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    run = load_run(run_dir)
    steps = [e["t"] for e in run.of("optimizer_step") if e.get("role") == "trainer"]
    opened = [e["t"] for e in run.of("epoch_open", actor="coordinator")]
    span = steps[-1] - opened[0]
    return {
        "samples_per_s": rows[0]["samples"] * len(steps) / span,
        "rewards": [round(r["reward_mean"], 4) for r in rows],
        "stale_groups": sum(
            v for r in rows for key, v in r.items() if key.startswith("staleness_") and key != "staleness_0"
        ),
        "is_corrected_frac": max((r.get("is_corrected_frac", 0.0) for r in rows), default=0.0),
    }


def run(ctx: BenchContext) -> list[Entry]:
    cores = len(os.sched_getaffinity(0))
    epochs = ctx.size(8, 5, 2)
    cases = ctx.size(CASES, CASES, (("periodic", 0), ("bounded", 1)))  # smoke: structure only, kept short
    entries = []
    for case in ctx.size(["demo", "h128-L4", "gen-heavy"], ["demo", "h128-L4", "gen-heavy"], ["demo"]):
        shape, overrides = shape_settings(ctx, case)
        model_dir = prepare(ctx, shape)
        base = {**overrides, "model.path": str(model_dir), "run.run_dir": str(ctx.work_dir / f"bloop-{case}")}
        iters = epochs
        loops = [measure_loop(base, model_dir, t, iters) for t in ctx.size(sorted({1, cores}), sorted({1, cores}), [1])]
        samples = overrides["coordinator.groups_per_epoch"] * overrides["worker.group_size"]
        loop_rate = max(samples * len(x["rows"]) / sum(r["wall_s"] for r in x["rows"]) for x in loops)
        got = {label(mode, k): measure(ctx, case, model_dir, mode, k, epochs) for mode, k in cases}
        ctx.say(
            f"  bounded {case}: loop {loop_rate:.0f} samples/s; "
            + ", ".join(f"{name} {g['samples_per_s']:.0f}" for name, g in got.items())
        )
        for name, g in got.items():
            ratio = g["samples_per_s"] / loop_rate
            raw = {"case": case, "mode": name, "loop_samples_per_s": loop_rate, "cores": float(cores), **g}
            entries.append(
                Entry(
                    benchmark="bounded",
                    name=f"{case} {name}",
                    metric="samples/s; ratio = over the single-process loop",
                    measured=round(g["samples_per_s"], 4),
                    unit="samples/s",
                    ratio=round(ratio, 4),
                    goal=None,
                    raw=rounded(raw, 4),
                    note=f"faster than the loop: {'yes' if ratio > 1 else 'no'}",
                )
            )
    return entries
