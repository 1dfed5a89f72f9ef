"""Phase times of a run, read from its JSON-lines logs (RUN_DIR/logs/<actor>.jsonl) alone.

Every event carries `t_mono` (time.monotonic, comparable across the processes of one host), so the
phases of epoch e are cut from events of different actors:

    open        coordinator `epoch_open`                 (epoch e is bound to v_e, work can go out)
    first_assign  coordinator's first `assign` of e
    gen_end     buffer `batch_complete`                  (the last group of e was accepted)
    train_end   trainer `span_end` of `optimizer_step`   (the one step of e is done)
    done        coordinator `epoch_done` for e           (v_{e+1} is stored by the publisher)

In sync mode the trainer gets nothing before gen_end, so T_gen = gen_end - open and
T_train = train_end - gen_end are the two phases the overlap can hide; what remains of the epoch
(upload, publish, the next open, the weight fetch inside the next T_gen) is T_other.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def read_events(log_dir: Path) -> list[dict[str, Any]]:
    """Every event of every actor, ordered by t_mono."""
    events = []
    for path in sorted(Path(log_dir).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by a killed process
                    continue
    events.sort(key=lambda e: e.get("t_mono", 0.0))
    return events


@dataclass
class EpochPhases:
    epoch: int
    open: float = float("nan")
    first_assign: float = float("nan")
    first_assign_worker: str = ""
    gen_end: float = float("nan")
    first_train: float = float("nan")
    last_train_end: float = float("nan")
    train_end: float = float("nan")
    done: float = float("nan")
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


def _epoch_of(ev: dict[str, Any]) -> int:
    return int(ev.get("epoch", -1))


def epoch_phases(events: list[dict[str, Any]]) -> dict[int, EpochPhases]:
    """Per-epoch phase timestamps (see the module docstring)."""
    ph: dict[int, EpochPhases] = defaultdict(lambda: EpochPhases(-1))
    for ev in events:
        _apply(ph, ev)
    out = {}
    for e, p in ph.items():
        p.epoch = e
        out[e] = p
    return dict(sorted(out.items()))


def _apply(ph: dict[int, EpochPhases], ev: dict[str, Any]) -> None:
    name, role, t = ev.get("event"), ev.get("role"), float(ev.get("t_mono", 0.0))
    if role == "coordinator":
        if name == "epoch_open":
            ph[_epoch_of(ev)].open = t
        elif name == "assign" and math.isnan(ph[_epoch_of(ev)].first_assign):
            ph[_epoch_of(ev)].first_assign = t
            ph[_epoch_of(ev)].first_assign_worker = str(ev.get("worker", ""))
        elif name == "epoch_done":
            ph[int(ev["done_epoch"])].done = t
    elif role == "buffer" and name == "batch_complete":
        ph[_epoch_of(ev)].gen_end = t
    elif role == "trainer":
        _trainer_event(ph, ev, name, t)
    elif role == "worker" and name == "span_end" and ev.get("span") == "weight_sync":
        ph[int(ev.get("new_version", -1))].worker_fetch_s[ev["actor"]] = float(ev.get("seconds", 0.0))
    elif role == "worker" and name == "span_end" and ev.get("span") == "generate":
        ph[_epoch_of(ev)].gen_busy_s += float(ev.get("seconds", 0.0))


def _trainer_event(ph: dict[int, EpochPhases], ev: dict[str, Any], name: Any, t: float) -> None:
    e = _epoch_of(ev)
    span = ev.get("span")
    if name == "span_begin" and span == "train" and math.isnan(ph[e].first_train):
        ph[e].first_train = t
    elif name == "span_end" and span == "train":
        ph[e].last_train_end = t
        ph[e].train_busy_s += float(ev.get("seconds", 0.0))
    elif name == "train_group":
        ph[e].samples += int(ev.get("samples", 0))
    elif name == "span_end" and span == "optimizer_step":
        ph[e].train_end = t
        ph[e].step_s = float(ev.get("seconds", 0.0))
        ph[e].train_busy_s += ph[e].step_s
    elif name == "span_end" and span == "weight_upload" and e >= 0:
        ph[e].upload_s = float(ev.get("seconds", 0.0))


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


def run_phases(log_dir: Path, skip: int = 1) -> RunPhases:
    """Throughput = samples of epochs skip..E-1 / (done[E-1] - done[skip-1]): every second of the
    measured epochs counts, turnarounds and weight transfers included."""
    phases = [p for e, p in epoch_phases(read_events(log_dir)).items() if e >= 0 and not math.isnan(p.done)]
    if len(phases) <= skip:
        raise ValueError(f"{log_dir}: {len(phases)} finished epochs, need more than {skip}")
    measured = phases[skip:]
    start = phases[skip - 1].done if skip > 0 else phases[0].open
    span = measured[-1].done - start
    n = len(measured)
    rows = [
        {
            "epoch": p.epoch,
            "open": p.open,
            "gen_end": p.gen_end,
            "train_end": p.train_end,
            "done": p.done,
            "t_gen": p.t_gen,
            "t_train_after_gen": p.t_train_after_gen,
            "train_busy_s": p.train_busy_s,
            "epoch_s": p.done - (phases[i].done if i >= 0 else p.open),
            "samples": p.samples,
        }
        for i, p in enumerate(measured, start=skip - 1)
    ]
    t_gen = sum(p.t_gen for p in measured) / n
    t_train = sum(p.t_train_after_gen for p in measured) / n
    epoch_s = span / n
    return RunPhases(
        epochs=n,
        samples_per_s=sum(p.samples for p in measured) / span,
        epoch_s=epoch_s,
        t_gen=t_gen,
        t_train=t_train,
        t_other=epoch_s - t_gen - t_train,
        train_busy_s=sum(p.train_busy_s for p in measured) / n,
        gen_busy_s=sum(p.gen_busy_s for p in measured) / n,
        per_epoch=rows,
        window=(start, measured[-1].done),
    )
