"""Benchmark: epoch time with M minibatch steps per epoch (trainer.num_minibatches), periodic vs sync.

Each case runs `prl-actors up` (one worker, the e2e settings) at M = 1, 2, 4, in periodic and in sync
mode, side by side in one run, at the demo and h128-L4 shapes. Reported: the median steady-state epoch
wall time (metrics.jsonl `wall_s`, epoch open -> weights stored) per case, and periodic's speed-up
over sync at the same M. With M > 1 periodic can step minibatch k while the later groups are still
generated (minibatches are cut by group index and the coordinator hands groups out in index order),
but the extra optimizer steps and the frozen old-policy forward add work to both modes.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from prl_bench.common import BenchContext, Entry, free_port, rounded, run_up, up_argv
from prl_bench.e2e import prepare, settings

MODES = ("periodic", "sync")


def measure(ctx: BenchContext, shape: str, model_dir: Path, m: int, mode: str, epochs: int) -> dict[str, Any]:
    run_dir = ctx.work_dir / f"minibatch-{shape}-M{m}-{mode}"
    overrides = {
        **settings(ctx, shape),
        "model.path": str(model_dir),
        "transport.base_port": free_port(5),
        "transport.auth": ctx.auth,
        "run.mode": mode,
        "trainer.num_minibatches": m,
    }
    cmd = up_argv(run_dir, 1, epochs, overrides)
    code, err = run_up(cmd, timeout_s=1800.0)
    if code != 0:
        raise RuntimeError(f"prl-actors up ({shape}, M={m}, {mode}) failed ({code}): {err[-1500:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steady = rows[1:] or rows
    return {
        "epoch_s": statistics.median(r["wall_s"] for r in steady),
        "train_s": statistics.median(r["train_s"] for r in steady),
        "optimizer_steps": rows[-1].get("optimizer_steps", 1.0),
        "epochs": len(rows),
    }


def run(ctx: BenchContext) -> list[Entry]:
    shapes = ctx.size(["demo", "h128-L4"], ["demo", "h128-L4"], ["demo"])
    splits = ctx.size([1, 2, 4], [1, 2, 4], [2])
    epochs = ctx.size(5, 3, 2)
    entries = []
    for shape in shapes:
        model_dir = prepare(ctx, shape)
        for m in splits:
            got = {mode: measure(ctx, shape, model_dir, m, mode, epochs) for mode in MODES}
            periodic_s, sync_s = got["periodic"]["epoch_s"], got["sync"]["epoch_s"]
            ctx.say(f"minibatch {shape} M={m}: periodic {periodic_s:.3f}s, sync {sync_s:.3f}s")
            speedup = got["sync"]["epoch_s"] / max(got["periodic"]["epoch_s"], 1e-9)
            raw = {"shape": shape, "M": m, **{f"{mode}_{k}": v for mode in MODES for k, v in got[mode].items()}}
            entries.append(
                Entry(
                    benchmark="minibatch",
                    name=f"{shape} M={m}",
                    metric="periodic epoch time; ratio = sync / periodic",
                    measured=round(got["periodic"]["epoch_s"], 6),
                    unit="s",
                    ratio=round(speedup, 4),
                    goal=None,
                    raw=rounded({**raw, "speedup": speedup}, 4),
                )
            )
    return entries
