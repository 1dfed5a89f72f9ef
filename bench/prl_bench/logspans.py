"""Phase times of a run, cut from its logs as `prl-actors replay` reads them.

The logs are loaded by replay (`prl_actors.replay.load_run`: every RUN_DIR/logs/<actor>.jsonl merged
into one timeline) and an epoch is replay's epoch window (`prl_actors.replay.epochs.windows`): from
the coordinator's `epoch_open` of e to its `epoch_open` of e+1, the last epoch to its `epoch_done`.
So an epoch's time means the same thing in `prl-actors bench` and in `prl-actors replay`.

Inside epoch e these points are cut from events of different actors (times on the run's `t_mono`
clock, which is comparable across the processes of one host and with time.monotonic()):

    open          coordinator `epoch_open` (the window's start: e is bound to v_e, work can go out)
    first_assign  coordinator's first `assign` of e (and the worker it went to)
    gen_end       buffer `batch_complete` (the last group of e was accepted)
    train_end     trainer `span_end` of `optimizer_step` (the one step of e is done)
    done          coordinator `epoch_done` of e (v_{e+1} is stored by the publisher)
    end           the window's end (the next `epoch_open`, or `done` for the last epoch)

In sync mode the trainer gets nothing before gen_end, so T_gen = gen_end - open and
T_train = train_end - gen_end are the two phases the overlap can hide; what remains of the epoch
(upload, publish, the next open, the weight fetch inside the next T_gen) is T_other.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prl_actors.replay import Run, load_run
from prl_actors.replay.epochs import SETUP, windows


@dataclass
class EpochPhases:
    epoch: int
    open: float = math.nan
    end: float = math.nan
    first_assign: float = math.nan
    first_assign_worker: str = ""
    gen_end: float = math.nan
    last_train_end: float = math.nan
    train_end: float = math.nan
    done: float = math.nan
    train_busy_s: float = 0.0  # sum of the trainer's train spans + the optimizer step
    gen_busy_s: float = 0.0  # sum of every worker's generate spans
    step_s: float = 0.0
    upload_s: float = 0.0
    samples: int = 0
    worker_fetch_s: dict[str, float] = field(default_factory=dict)  # weight_sync span of epoch e's version

    @property
    def t_gen(self) -> float:
        return self.gen_end - self.open

    @property
    def t_train_after_gen(self) -> float:
        """Train time left after generation ended (all of it in sync mode)."""
        return self.train_end - self.gen_end

    @property
    def wall(self) -> float:
        return self.end - self.open


def load(run_dir: Path) -> Run:
    """The run's merged timeline; its clock must be one host's t_mono (every benchmark run is local)."""
    run = load_run(run_dir)
    if run.clock != "t_mono":
        raise ValueError(f"{run_dir}: the logs are not on one host's monotonic clock")
    return run


def epoch_phases(run_dir: Path) -> dict[int, EpochPhases]:
    """Per-epoch phase timestamps (see the module docstring), for every epoch that opened."""
    run = load(run_dir)
    ph: dict[int, EpochPhases] = defaultdict(lambda: EpochPhases(-1))
    for w in windows(run):
        if w.epoch != SETUP:
            ph[w.epoch].open, ph[w.epoch].end = w.start + run.t0, w.end + run.t0
    for ev in run.events:
        _apply(ph, ev)
    opened = {e: p for e, p in ph.items() if not math.isnan(p.open)}
    for e, p in opened.items():
        p.epoch = e
    return dict(sorted(opened.items()))


def _epoch_of(ev: dict[str, Any]) -> int:
    return int(ev.get("epoch", -1))


def _apply(ph: dict[int, EpochPhases], ev: dict[str, Any]) -> None:
    name, role, t = ev["event"], ev.get("role"), float(ev["t_mono"])
    if role == "coordinator":
        if name == "assign" and math.isnan(ph[_epoch_of(ev)].first_assign):
            ph[_epoch_of(ev)].first_assign = t
            ph[_epoch_of(ev)].first_assign_worker = str(ev.get("worker", ""))
        elif name == "epoch_done":
            ph[int(ev["done_epoch"])].done = t
    elif role == "buffer" and name == "batch_complete":
        ph[_epoch_of(ev)].gen_end = t
    elif role == "trainer":
        _trainer_event(ph[_epoch_of(ev)], ev, name, t)
    elif role == "worker" and name == "span_end" and ev.get("span") == "weight_sync":
        ph[int(ev.get("new_version", -1))].worker_fetch_s[ev["actor"]] = float(ev.get("seconds", 0.0))
    elif role == "worker" and name == "span_end" and ev.get("span") == "generate":
        ph[_epoch_of(ev)].gen_busy_s += float(ev.get("seconds", 0.0))


def _trainer_event(p: EpochPhases, ev: dict[str, Any], name: str, t: float) -> None:
    span = ev.get("span")
    if name == "span_end" and span == "train":
        p.last_train_end = t
        p.train_busy_s += float(ev.get("seconds", 0.0))
    elif name == "train_group":
        p.samples += int(ev.get("samples", 0))
    elif name == "span_end" and span == "optimizer_step":
        p.train_end = t
        p.step_s = float(ev.get("seconds", 0.0))
        p.train_busy_s += p.step_s
    elif name == "span_end" and span == "weight_upload":
        p.upload_s = float(ev.get("seconds", 0.0))


@dataclass
class RunPhases:
    """Steady-state numbers of one run: epochs 1..E-1 (epoch 0 warms up and is left out)."""

    epochs: int
    samples_per_s: float
    epoch_s: float
    t_gen: float
    t_train: float
    t_other: float
    train_busy_s: float
    gen_busy_s: float
    per_epoch: list[dict[str, float]]
    window: tuple[float, float] = (0.0, 0.0)  # t_mono of the measured span (start, end)


def run_phases(run_dir: Path, skip: int = 1) -> RunPhases:
    """Throughput = samples of the finished epochs skip.. / the time of their epoch windows (from the
    `epoch_open` of epoch skip to the end of the last one): every second of the measured epochs
    counts, turnarounds and weight transfers included."""
    phases = [p for p in epoch_phases(run_dir).values() if p.epoch >= 0 and not math.isnan(p.done)]
    if len(phases) <= skip:
        raise ValueError(f"{run_dir}: {len(phases)} finished epochs, need more than {skip}")
    measured = phases[skip:]
    start, end = measured[0].open, measured[-1].end
    n = len(measured)
    t_gen = sum(p.t_gen for p in measured) / n
    t_train = sum(p.t_train_after_gen for p in measured) / n
    epoch_s = (end - start) / n
    return RunPhases(
        epochs=n,
        samples_per_s=sum(p.samples for p in measured) / (end - start),
        epoch_s=epoch_s,
        t_gen=t_gen,
        t_train=t_train,
        t_other=epoch_s - t_gen - t_train,
        train_busy_s=sum(p.train_busy_s for p in measured) / n,
        gen_busy_s=sum(p.gen_busy_s for p in measured) / n,
        per_epoch=[_row(p) for p in measured],
        window=(start, end),
    )


def _row(p: EpochPhases) -> dict[str, float]:
    return {
        "epoch": p.epoch,
        "open": p.open,
        "gen_end": p.gen_end,
        "train_end": p.train_end,
        "done": p.done,
        "t_gen": p.t_gen,
        "t_train_after_gen": p.t_train_after_gen,
        "train_busy_s": p.train_busy_s,
        "epoch_s": p.wall,
        "samples": p.samples,
    }
