"""Benchmark 1 (real model): periodic vs sync with the built-in tiny LM, GRPO, one process per actor.

Each run is a real `prl-actors up` (tcp, `worker.engine: torch`, `trainer.learner: grpo`, one torch
thread per process), both modes on the same prepared model directory. A sampler reads every actor
process's CPU time from /proc during the run, so the bound can account for the CPU:

  ideal  (T_gen + T_train) / max(T_gen, T_train), from the sync run's phases (as for the sim);
  cpu    S / max(max(T_gen, T_train) + T_other, C / cores): S is the sync epoch, C the CPU-seconds one
         sync epoch burns in all actors. On a 2-core host W generating workers and the trainer share
         two cores: overlap can only fill cores that sit idle in sync mode, so once generation alone
         keeps both cores busy, periodic cannot beat sync whatever the phase times say.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from prl_bench.common import BenchContext, Entry, free_port, run_up
from prl_bench.logspans import RunPhases, run_phases
from prl_bench.overlap import bounds, compare
from prl_bench.procstat import TreeSampler


def unavailable() -> str:
    """Why the real-model pipeline cannot run here ('' when it can)."""
    try:
        import prl_actors.engines.torch_engine  # noqa: F401
        import prl_actors.training.grpo  # noqa: F401
        from prl_actors.model import prepare_model  # noqa: F401
    except ImportError as exc:
        return f"learning plane not importable: {exc}"
    return ""


def settings(ctx: BenchContext, workers: int, mode: str, model_dir: Path, port: int) -> dict[str, Any]:
    return {
        "run.mode": mode,
        "run.workers": workers,
        "run.epochs": ctx.size(8, 5, 2),
        "transport.kind": "tcp",
        "transport.auth": ctx.auth,  # curve, as a run (the default), unless `prl-actors bench --auth none`
        "transport.base_port": port,
        "coordinator.groups_per_epoch": ctx.size(32, 32, 4),
        "coordinator.heartbeat_interval_s": 0.5,
        "coordinator.heartbeat_timeout_s": 10.0,
        "worker.engine": "torch",
        "worker.group_size": 8,
        # this measures the overlap schedule, which needs groups to finish over the epoch: with equal
        # 4-token answers a worker's whole share in one batch (the 256-row default) finishes in one step
        "worker.max_batch_rows": 64,
        "worker.threads": 1,
        "worker.sampling.max_new_tokens": 4,
        "trainer.learner": "grpo",
        "trainer.threads": 1,
        "trainer.checkpoint_every": 0,
        "model.path": str(model_dir),
        "task.name": "add",
    }


def prepare(ctx: BenchContext) -> Path:
    """The built-in model, built once for every run (warm start shortened: speed does not need skill)."""
    from prl_actors.config import load_config
    from prl_actors.launch import build

    where = ctx.work_dir / "model-prep"
    cfg = load_config(None, {"run.run_dir": str(where), "model.warm_start_steps": ctx.size(100, 50, 0)})
    return build.model_dir(cfg, where)


def run_torch(ctx: BenchContext, workers: int, mode: str, model_dir: Path) -> tuple[RunPhases, dict[str, float]]:
    run_dir = ctx.work_dir / f"torch-w{workers}-{mode}"
    cmd = [sys.executable, "-m", "prl_actors.cli.main", "up", "--run-dir", str(run_dir)]
    for k, v in settings(ctx, workers, mode, model_dir, free_port(5)).items():
        cmd += ["--set", f"{k}={v}"]
    holder: dict[str, TreeSampler] = {}

    def started(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
        holder["s"] = TreeSampler(proc.pid)
        holder["s"].start()

    code, err = run_up(cmd, timeout_s=600.0, on_start=started)
    holder["s"].stop()
    if code != 0:
        raise RuntimeError(f"torch run {run_dir} failed ({code}): {err[-1500:]}")
    phases = run_phases(run_dir)
    return phases, cpu_profile(holder["s"], phases)


def cpu_profile(sampler: TreeSampler, ph: RunPhases) -> dict[str, float]:
    """CPU-seconds per epoch: all actors, workers, trainer; and in the gen / train phases (sync)."""
    t0, t1 = ph.window
    n = max(1, ph.epochs)
    rows = ph.per_epoch
    return {
        "cpu_per_epoch": sampler.cpu_between(t0, t1) / n,
        "cpu_workers_per_epoch": sampler.cpu_between(t0, t1, "worker") / n,
        "cpu_trainer_per_epoch": sampler.cpu_between(t0, t1, "trainer") / n,
        "cpu_in_gen_phase": sum(sampler.cpu_between(r["open"], r["gen_end"]) for r in rows) / n,
        "cpu_in_train_phase": sum(sampler.cpu_between(r["gen_end"], r["train_end"]) for r in rows) / n,
        "cores_busy": sampler.cpu_between(t0, t1) / max(1e-9, t1 - t0),
        "cores_used_by_others": sampler.others_cores(t0, t1),
    }


def cpu_bound(sync: RunPhases, cpu: dict[str, float], cores: float) -> float:
    tg, tt, to = sync.t_gen, sync.t_train, max(0.0, sync.t_other)
    return (tg + tt + to) / max(max(tg, tt) + to, cpu["cpu_per_epoch"] / cores)


def run(ctx: BenchContext) -> list[Entry]:
    why = unavailable()
    if why:
        ctx.say(f"  pipeline torch skipped: {why}")
        return []
    model_dir = prepare(ctx)
    cores = len(os.sched_getaffinity(0))
    entries = []
    for w in ctx.size([1, 2, 4], [1, 2], [1]):
        sync, cpu_s = run_torch(ctx, w, "sync", model_dir)
        periodic, cpu_p = run_torch(ctx, w, "periodic", model_dir)
        groups = settings(ctx, w, "sync", model_dir, 0)["coordinator.groups_per_epoch"]
        b = bounds(sync, w, groups)
        extra = {"workers": w, "cores": cores, **{f"sync_{k}": v for k, v in cpu_s.items()}}
        extra.update({f"periodic_{k}": v for k, v in cpu_p.items()})
        extra["bound_cpu"] = cpu_bound(sync, cpu_s, cores)
        extra["of_cpu_bound"] = (periodic.samples_per_s / sync.samples_per_s) / extra["bound_cpu"]
        free = max(0.5, cores - cpu_p["cores_used_by_others"])  # what other users left us
        extra["bound_cpu_free_cores"] = cpu_bound(sync, cpu_s, free)
        extra["of_cpu_free_bound"] = (periodic.samples_per_s / sync.samples_per_s) / extra["bound_cpu_free_cores"]
        entry = compare("torch", f"W={w}", sync, periodic, b, extra)
        entry.note = (
            f"CPU-aware bound {extra['bound_cpu']:.2f} ({extra['of_cpu_bound']:.2f} of it); with the "
            f"{free:.2f} cores other users left: {extra['bound_cpu_free_cores']:.2f} ({extra['of_cpu_free_bound']:.2f})"
        )
        ctx.say(
            f"  pipeline torch W={w}: speedup {entry.measured:.3f}, ideal {entry.bound:.3f}, "
            f"cpu bound {extra['bound_cpu']:.3f}; sync uses {cpu_s['cores_busy']:.2f} cores, periodic "
            f"{cpu_p['cores_busy']:.2f}"
        )
        entries.append(entry)
    return entries
