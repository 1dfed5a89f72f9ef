"""Benchmark 1 (simulated engine): periodic vs sync on the same config, against the overlap bound.

For each case (W workers, ratio r = T_gen / T_train) the same config runs in `sync` and then in
`periodic` mode, back to back, all actors in this process (LocalCluster, inproc://; the sim's costs
are sleeps, so 64 workers fit in one process). Throughput comes from the logs (see logspans.py).

Bounds, all from the *sync* run's own phase times:
  ideal     (T_gen + T_train) / max(T_gen, T_train)                  what overlap could give at best
  overhead  (T_gen + T_train + T_other) / (max(T_gen, T_train) + T_other)  T_other (upload, publish,
            epoch open) is paid by both modes
  schedule  the overhead bound with the pipeline's fill and drain: groups finish in rounds of W every
            T_gen / rounds, the trainer takes T_train / B per group, so the trainer cannot start
            before the first round and cannot finish before the last group is trained.
The goal (>= 0.95) is checked against the ideal bound; the other two say where the rest goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prl_bench import pipeline_torch
from prl_bench.common import BenchContext, Entry
from prl_bench.logspans import RunPhases, run_phases
from prl_bench.overlap import bounds, compare

GROUP_SIZE = 8
TOKENS = 8


@dataclass
class SimCase:
    workers: int
    ratio: float  # nominal T_gen / T_train
    rounds: int  # groups per worker per epoch
    group_s: float  # generation time of one group (slept)
    epochs: int

    @property
    def groups(self) -> int:
        return self.workers * self.rounds

    @property
    def train_s_per_group(self) -> float:
        return self.rounds * self.group_s / self.ratio / self.groups

    @property
    def label(self) -> str:
        return f"W={self.workers} r={self.ratio:g}"


MAX_GROUPS_PER_S = 150.0
"""Every actor of a sim run shares one process (one GIL): it moves ~400 groups/s at most here, each
group costing ~3 ms of CPU in thread wake-ups and GIL hand-offs (measured with perf). Runs are
sized to stay well under that, so they measure the overlap and not the harness."""


def sim_cases(ctx: BenchContext) -> list[SimCase]:
    """A ratio sweep at W=8 and a worker sweep at r=1; the group time grows with W so that W
    workers finish at most MAX_GROUPS_PER_S groups per second together."""
    rounds = ctx.size(32, 12, 4)
    epochs = ctx.size(3, 3, 2)
    ratios = ctx.size([0.25, 0.5, 1.0, 2.0, 4.0], [0.5, 1.0, 2.0], [1.0])
    workers = ctx.size([2, 4, 8, 16, 32, 64], [2, 8, 32], [2])
    base = ctx.size(0.02, 0.012, 0.004)

    def case(w: int, r: float) -> SimCase:
        return SimCase(w, r, rounds, max(base, w / MAX_GROUPS_PER_S), epochs)

    cases = [case(8 if not ctx.smoke else 2, r) for r in ratios]
    cases += [case(w, 1.0) for w in workers if (w, 1.0) not in {(c.workers, c.ratio) for c in cases}]
    return cases


def sim_config(case: SimCase, mode: str, run_dir: Path):  # type: ignore[no-untyped-def]
    from prl_actors.config import load_config

    return load_config(
        None,
        {
            "run.name": f"bench-{run_dir.name}",
            "run.mode": mode,
            "run.workers": case.workers,
            "run.epochs": case.epochs,
            "run.run_dir": str(run_dir),
            "transport.kind": "inproc",
            "coordinator.groups_per_epoch": case.groups,
            "coordinator.heartbeat_interval_s": 0.5,
            "coordinator.heartbeat_timeout_s": 10.0,  # 130 threads share one GIL: no false timeouts
            "worker.engine": "sim",
            "worker.group_size": GROUP_SIZE,
            # one group at a time, as `rounds` and the schedule estimate assume: the sim's step costs
            # gen_s_per_token x rows (no batching gain), so a larger running batch only delays groups
            "worker.max_batch_rows": GROUP_SIZE,
            "trainer.learner": "sim",
            "trainer.checkpoint_every": 0,
            "sim.tokens_per_sample": TOKENS,
            "sim.gen_s_per_token": case.group_s / (GROUP_SIZE * TOKENS),
            "sim.train_s_per_sample": case.train_s_per_group / GROUP_SIZE,
            "sim.param_count": 262144,
        },
    )


def run_sim(case: SimCase, mode: str, run_dir: Path) -> RunPhases:
    """One run in this process; its phases from its own logs."""
    from prl_actors.launch.process import LocalCluster

    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = sim_config(case, mode, run_dir)
    per_epoch = case.rounds * case.group_s + case.groups * case.train_s_per_group
    cluster = LocalCluster(cfg, log_dir=run_dir / "logs")
    try:
        if not cluster.wait(30 + 4 * case.epochs * per_epoch):
            raise RuntimeError(f"sim run {run_dir} did not finish in time; see {run_dir}/logs")
    finally:
        cluster.close()
    return run_phases(run_dir)


def run(ctx: BenchContext) -> list[Entry]:
    entries = []
    for case in sim_cases(ctx):
        tag = f"sim-w{case.workers}-r{case.ratio:g}"
        sync = run_sim(case, "sync", ctx.work_dir / f"{tag}-sync")
        periodic = run_sim(case, "periodic", ctx.work_dir / f"{tag}-periodic")
        extra = {
            "workers": case.workers,
            "groups_per_epoch": case.groups,
            "group_gen_s": case.group_s,
            "group_train_s": case.train_s_per_group,
        }
        entry = compare("sim", case.label, sync, periodic, bounds(sync, case.workers, case.groups), extra)
        ctx.say(
            f"  pipeline sim {case.label:<12} B={case.groups:<5} speedup {entry.measured:.3f} "
            f"ideal {entry.bound:.3f} -> {entry.ratio:.3f} of bound"
        )
        entries.append(entry)
    return entries + pipeline_torch.run(ctx)
