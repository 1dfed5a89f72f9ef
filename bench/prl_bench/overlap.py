"""The pipeline benchmark's bounds and its result entry, shared by the sim and the torch cases.

All bounds come from the *sync* run's own phase times (see pipeline.py and logspans.py):
  ideal     (T_gen + T_train) / max(T_gen, T_train)
  overhead  (T_gen + T_train + T_other) / (max(T_gen, T_train) + T_other)
  schedule  the overhead bound with the pipeline's fill and drain (groups finish in rounds of W).
"""

from __future__ import annotations

import math
from typing import Any

from prl_bench.common import Entry, rounded
from prl_bench.logspans import RunPhases


def schedule_epoch_s(workers: int, groups: int, round_s: float, train_s: float) -> float:
    """Earliest end of training when W groups finish every `round_s` and each takes `train_s`."""
    done = 0.0
    for i in range(groups):
        arrive = (i // workers + 1) * round_s
        done = max(done, arrive) + train_s
    return done


def bounds(sync: RunPhases, workers: int, groups: int) -> dict[str, float]:
    tg, tt, to = sync.t_gen, sync.t_train, max(0.0, sync.t_other)
    rounds = math.ceil(groups / workers)
    sched = schedule_epoch_s(workers, groups, tg / rounds, tt / groups)
    return {
        "ideal": (tg + tt) / max(tg, tt),
        "overhead": (tg + tt + to) / (max(tg, tt) + to),
        "schedule": (tg + tt + to) / (max(sched, tg) + to),
    }


def compare(name: str, label: str, sync: RunPhases, periodic: RunPhases, b: dict[str, float], extra: dict) -> Entry:  # type: ignore[type-arg]
    speedup = periodic.samples_per_s / sync.samples_per_s
    raw: dict[str, Any] = {
        "sync_samples_per_s": sync.samples_per_s,
        "periodic_samples_per_s": periodic.samples_per_s,
        "speedup": speedup,
        "T_gen_s": sync.t_gen,
        "T_train_s": sync.t_train,
        "T_other_s": sync.t_other,
        "sync_epoch_s": sync.epoch_s,
        "periodic_epoch_s": periodic.epoch_s,
        "periodic_T_gen_s": periodic.t_gen,
        "gen_busy_s_sum_workers": sync.gen_busy_s,
        "train_busy_s": sync.train_busy_s,
        "bound_ideal": b["ideal"],
        "bound_overhead": b["overhead"],
        "bound_schedule": b["schedule"],
        "of_overhead_bound": speedup / b["overhead"],
        "of_schedule_bound": speedup / b["schedule"],
        "epochs_measured": sync.epochs,
        **extra,
    }
    return Entry(
        benchmark="pipeline",
        name=f"{name} {label}",
        metric="periodic/sync samples/s, as a fraction of (T_gen+T_train)/max(T_gen,T_train)",
        measured=speedup,
        unit="x",
        ratio=speedup / b["ideal"],
        goal=0.95 if name == "sim" else 0.85,
        bound=b["ideal"],
        raw=rounded(raw, 5),
    )
