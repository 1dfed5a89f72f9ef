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

The pull policy (weights/pulls.py): every case also reports the worker's weight loads per epoch (loads
of v0 .. v_{E-1} over E; periodic and sync load each version once, 1.0), the versions it never loaded,
and the loads it saved per epoch against loading every version (1 - loads per epoch); bounded k = 2 is
also run with worker.sync_kl_threshold 0 (pull every new version as soon as it is announced: the
eager baseline) and DRIFT_THRESHOLD (pull when the estimated KL of the held weights from the newest
crosses it), with the drift pulls and the trainer's mean step KL.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from prl_bench.common import BenchContext, Entry, free_port, rounded, run_up, up_argv
from prl_bench.e2e import measure_loop, prepare, settings

DRIFT_THRESHOLD = 0.01  # worker.sync_kl_threshold of the drift case (the demo's steps: 0.06 .. 0.09 on average)
# (mode, k, worker.sync_kl_threshold)
CASES: tuple[tuple[str, int, float | None], ...] = (
    ("sync", 0, None),
    ("periodic", 0, None),
    ("bounded", 1, None),
    ("bounded", 2, None),
    ("bounded", 2, 0.0),
    ("bounded", 2, DRIFT_THRESHOLD),
)


def shape_settings(ctx: BenchContext, case: str) -> tuple[str, dict[str, Any]]:
    """(model shape, overrides) of a case: demo, h128-L4, or gen-heavy (h128-L4, long responses)."""
    if case == "gen-heavy":
        return "h128-L4", {**settings(ctx, "h128-L4"), "worker.sampling.max_new_tokens": ctx.size(32, 32, 12)}
    return case, settings(ctx, case)


def label(mode: str, k: int, threshold: float | None = None) -> str:
    if mode != "bounded":
        return mode
    return f"bounded_k{k}" + ("" if threshold is None else f"_kl{threshold:g}")


def pulls(events: list[dict[str, Any]], epochs: int) -> dict[str, Any]:
    """The workers' weight loads of v0 .. v_{E-1} (worker `weights_pulled`; v_E, pulled before the run
    ends, is left out), per worker and epoch, and what they skipped."""
    loads = [e for e in events if e.get("event") == "weights_pulled" and e.get("new_version", 0) < epochs]
    workers = max(len({e.get("actor") for e in loads}), 1)
    per_epoch = len(loads) / workers / epochs
    return {
        "weight_loads_per_epoch": per_epoch,
        "loads_saved_per_epoch": 1.0 - per_epoch,
        "versions_skipped": sum(int(e.get("skipped", 0)) for e in loads),
        "drift_pulls": sum(e.get("reason") == "drift" for e in loads),
    }


def measure(
    ctx: BenchContext,
    case: str,
    model_dir: Path,
    mode: str,
    k: int,
    epochs: int,
    threshold: float | None = None,
) -> dict[str, Any]:
    from prl_actors.replay.events import load_run

    _, overrides = shape_settings(ctx, case)
    run_dir = ctx.work_dir / f"bounded-{case}-{label(mode, k, threshold)}"
    sets = {
        **overrides,
        "model.path": str(model_dir),
        "transport.base_port": free_port(5),
        "transport.auth": ctx.auth,
        "run.mode": mode,
        "run.max_staleness": k,
        "trainer.is_correction": "tis" if k else "none",
    }
    if threshold is not None:
        sets["worker.sync_kl_threshold"] = threshold
    cmd = up_argv(run_dir, 1, epochs, sets)
    code, err = run_up(cmd, timeout_s=1800.0)
    if code != 0:
        raise RuntimeError(f"prl-actors up ({case}, {label(mode, k, threshold)}) failed ({code}): {err[-1500:]}")
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
        **pulls([e for e in run.events if e.get("role") == "worker"], len(rows)),
        "step_kl_mean": sum(kls) / len(kls) if (kls := [r["step_kl"] for r in rows if "step_kl" in r]) else None,
    }


def run(ctx: BenchContext) -> list[Entry]:
    entries = []
    for case in ctx.size(["demo", "h128-L4", "gen-heavy"], ["demo", "h128-L4", "gen-heavy"], ["demo"]):
        entries += run_case(ctx, case)
    return entries


def run_case(ctx: BenchContext, case: str) -> list[Entry]:
    """Every mode of CASES and the loop at one shape (demo, h128-L4, gen-heavy)."""
    cores = len(os.sched_getaffinity(0))
    epochs = ctx.size(8, 5, 2)
    smoke_cases = (("periodic", 0, None), ("bounded", 1, None))  # smoke: structure only, kept short
    cases = ctx.size(CASES, CASES, smoke_cases)
    entries = []
    shape, overrides = shape_settings(ctx, case)
    model_dir = prepare(ctx, shape)
    base = {**overrides, "model.path": str(model_dir), "run.run_dir": str(ctx.work_dir / f"bloop-{case}")}
    iters = epochs
    loops = [measure_loop(base, model_dir, t, iters) for t in ctx.size(sorted({1, cores}), sorted({1, cores}), [1])]
    samples = overrides["coordinator.groups_per_epoch"] * overrides["worker.group_size"]
    loop_rate = max(samples * len(x["rows"]) / sum(r["wall_s"] for r in x["rows"]) for x in loops)
    got = {label(mode, k, t): measure(ctx, case, model_dir, mode, k, epochs, t) for mode, k, t in cases}
    ctx.say(
        f"  bounded {case}: loop {loop_rate:.0f} samples/s; "
        + ", ".join(
            f"{name} {g['samples_per_s']:.0f} ({g['weight_loads_per_epoch']:.2f} loads/epoch)"
            for name, g in got.items()
        )
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
