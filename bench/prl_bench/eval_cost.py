"""Benchmark: what evaluation during training costs the training (docs/OBSERVE.md).

The demo config (configs/demo.yaml: 2 workers, B=32, G=8) through `prl-actors up`, three times: no
evaluation, evaluation every 5 epochs, and every epoch (the worst case), each with k = 4 samples of 64
prompts. Reported side by side: the median period from one epoch's opening to the next (the checked
number: it includes any wait for an evaluation), the median epoch time of the training epochs
(metrics.jsonl wall_s: EpochOpen to the step's weights stored), the run's wall time, the median time an
evaluation took (eval_s: its first prompt queued to its last result), and how often and how long an
epoch's opening waited for an evaluation still out (coordinator log: epoch_open_deferred). Eval prompts
go to workers only when the epoch's own queue is empty, so the cost shows up only as that wait.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from prl_bench.common import BenchContext, Entry, free_port, rounded, run_up

REPO = Path(__file__).resolve().parents[2]
VARIANTS = {"off": 0, "every 5": 5, "every epoch": 1}
SMOKE = {"coordinator.groups_per_epoch": 4, "eval.num_prompts": 4, "transport.kind": "inproc"}


def measure(ctx: BenchContext, name: str, every: int, epochs: int) -> dict[str, Any]:
    run_dir = ctx.work_dir / f"eval-{every}"
    cmd = [sys.executable, "-m", "prl_actors.cli.main", "up", "--config", str(REPO / "configs/demo.yaml")]
    cmd += ["--run-dir", str(run_dir), "--epochs", str(epochs)]
    sets = {
        "eval.every_epochs": every,
        "eval.samples": 4,
        "eval.num_prompts": 64,
        "transport.base_port": free_port(5),
        "trainer.checkpoint_every": 0,
        **(SMOKE if ctx.smoke else {}),
    }
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    t0 = time.monotonic()
    if ctx.smoke:  # structure only: the sim config in this process (no model, no process start-ups)
        _in_process(run_dir, sets, epochs)
    else:
        code, err = run_up(cmd, timeout_s=900.0)
        if code != 0:
            raise RuntimeError(f"prl-actors up (eval {name}) failed ({code}): {err[-1500:]}")
    wall = time.monotonic() - t0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [r for r in rows if not r.get("eval")]
    evals = [r for r in rows if r.get("eval")]
    steady = train[1:] or train
    periods = epoch_periods(run_dir)
    return {
        "period_s_median": statistics.median(periods[1:] or periods),
        "epoch_s_median": statistics.median(r["wall_s"] for r in steady),
        "run_wall_s": wall,
        "evaluations": len(evals),
        "eval_s_median": statistics.median(r["eval_s"] for r in evals) if evals else 0.0,
        **deferred(run_dir),
    }


def _in_process(run_dir: Path, sets: dict[str, Any], epochs: int) -> None:
    from prl_actors.config import load_config
    from prl_actors.launch.process import LocalCluster

    overrides = {**sets, "run.run_dir": str(run_dir), "run.epochs": epochs, "run.name": f"eval-cost-{run_dir.name}"}
    overrides.pop("transport.base_port", None)
    cfg = load_config(REPO / "configs/sim.yaml", overrides)
    cluster = LocalCluster(cfg, workers=2, log_dir=run_dir / "logs")
    try:
        if not cluster.wait(120):
            raise RuntimeError("the smoke run did not finish in 120 s")
    finally:
        cluster.close()


def epoch_periods(run_dir: Path) -> list[float]:
    """Seconds from each epoch's opening to the next one's (coordinator log): the epoch time including any
    wait for an evaluation (metrics.jsonl wall_s ends with the step, before that wait)."""
    events = [json.loads(x) for x in (run_dir / "logs/coordinator.jsonl").read_text().splitlines() if x.strip()]
    opens = [float(e["t_mono"]) for e in events if e.get("event") == "epoch_open"]
    return [b - a for a, b in zip(opens, opens[1:], strict=False)]


def deferred(run_dir: Path) -> dict[str, Any]:
    """How often an epoch's opening waited for an evaluation, and for how long in all (seconds)."""
    events = [json.loads(x) for x in (run_dir / "logs/coordinator.jsonl").read_text().splitlines() if x.strip()]
    waits, since = [], None
    for e in events:
        if e.get("event") == "epoch_open_deferred" and "evaluation" in str(e.get("reason", "")):
            since = since if since is not None else float(e.get("t_mono", 0.0))
        elif e.get("event") == "epoch_open" and since is not None:
            waits.append(float(e.get("t_mono", 0.0)) - since)
            since = None
    return {"opens_deferred": len(waits), "deferred_s_total": sum(waits)}


def run(ctx: BenchContext) -> list[Entry]:
    epochs = ctx.size(30, 15, 3)
    results = {}
    for name, every in VARIANTS.items():
        ctx.say(f"eval_cost: demo config, eval {name}, {epochs} epochs")
        results[name] = measure(ctx, name, every, epochs)
    base, off_wall = results["off"]["period_s_median"], results["off"]["run_wall_s"]
    entries = []
    for name in ("every 5", "every epoch"):
        r = results[name]
        ratio = r["period_s_median"] / base if base > 0 else float("nan")
        entries.append(
            Entry(
                "eval_cost",
                f"demo: epoch time with eval {name} vs without",
                "median s from one epoch_open to the next, with eval over without (k=4 x 64 prompts)",
                r["period_s_median"],
                "s",
                ratio,
                None,
                op="<=",
                bound=base,
                raw=rounded({"off": results["off"], name: r}),
                note=f"eval_s median {r['eval_s_median']:.3f}; {r['opens_deferred']} opens waited "
                f"{r['deferred_s_total']:.3f}s in all; run {r['run_wall_s']:.1f}s vs {off_wall:.1f}s",
            )
        )
    return entries
