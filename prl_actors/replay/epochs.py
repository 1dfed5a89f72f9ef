"""Per-epoch numbers from a run's timeline: wall, generation, training, idle (bubbles), overlap, groups.

Epoch windows partition the run: epoch e runs from the coordinator's `epoch_open` of e to the
`epoch_open` of e+1 (the last epoch to the coordinator's `epoch_done` of it, else `run_done`, else the
last event); a `setup` window precedes epoch 0. Weight sync of v_{e+1} therefore counts in epoch e+1,
the iteration it starts. For each actor with spans, idle = its time in the window (clipped to its
lifetime) minus the union of its busy spans there. Overlap = |trainer `train` ∩ any worker `generate`|:
positive in periodic mode, zero in sync mode.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prl_actors.replay.spans import BUSY_SPANS, Span, Track, intersect, intervals, lifetime, total

if TYPE_CHECKING:
    from prl_actors.replay.events import Event, Run

SETUP = -1


@dataclass(frozen=True)
class Window:
    epoch: int  # SETUP for the time before the first epoch opened
    version: int
    start: float
    end: float

    @property
    def wall(self) -> float:
        return self.end - self.start

    @property
    def label(self) -> str:
        return "setup" if self.epoch == SETUP else str(self.epoch)


@dataclass
class EpochStats:
    window: Window
    gen_s: float | None = None  # epoch open -> the last group accepted (coordinator `epoch_generated`)
    train_s: float = 0.0  # trainer busy in `train` and `optimizer_step`
    overlap_s: float = 0.0
    trainer_idle: float = 0.0
    trainer_time: float = 0.0  # the trainer's time in the window (the idle share's denominator)
    worker_idle: dict[str, float] = field(default_factory=dict)
    worker_time: dict[str, float] = field(default_factory=dict)
    upload_s: float = 0.0  # trainer `weight_upload`
    sync_s: dict[str, float] = field(default_factory=dict)  # per worker `weight_sync`
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    joins: list[str] = field(default_factory=list)
    leaves: list[tuple[str, str]] = field(default_factory=list)
    requeued: list[tuple[str, list[int], str]] = field(default_factory=list)


def windows(run: Run) -> list[Window]:
    """The setup window, then one window per opened epoch, in order."""
    opens: dict[int, tuple[float, int]] = {}
    for e in run.of("epoch_open", actor="coordinator") or run.of("train_epoch_begin"):
        opens.setdefault(int(e["epoch"]), (e["t"], int(e["version"] if "version" in e else e["epoch"])))
    order = sorted(opens.items(), key=lambda kv: kv[1][0])
    if not order:
        return [Window(SETUP, -1, 0.0, run.duration)]
    out = [Window(SETUP, -1, 0.0, order[0][1][0])]
    for i, (epoch, (start, version)) in enumerate(order):
        end = order[i + 1][1][0] if i + 1 < len(order) else _last_end(run, epoch)
        out.append(Window(epoch, version, start, max(start, end)))
    return out


def _last_end(run: Run, epoch: int) -> float:
    done = [e["t"] for e in run.of("epoch_done", actor="coordinator") if e.get("done_epoch") == epoch]
    finished = [e["t"] for e in run.of("run_done", actor="coordinator")]
    return (done or finished or [run.duration])[0]


def epoch_of(wins: list[Window], t: float) -> Window | None:
    """The window holding time `t` (None after the last epoch ended)."""
    i = bisect_right([w.start for w in wins], t) - 1
    if i < 0 or (t > wins[i].end if i == len(wins) - 1 else t >= wins[i].end):
        return None
    return wins[i]


class Tracks:
    """The busy intervals of (actor, span names), each built once and clipped per window."""

    def __init__(self, spans: list[Span]) -> None:
        self.spans = spans
        self._cache: dict[tuple[str, tuple[str, ...]], Track] = {}

    def get(self, actor: str, names: tuple[str, ...]) -> Track:
        key = (actor, names)
        if key not in self._cache:
            self._cache[key] = Track(intervals(self.spans, actor, names))
        return self._cache[key]

    def seconds(self, actor: str, names: tuple[str, ...], lo: float, hi: float) -> float:
        return total(self.get(actor, names).within(lo, hi))


def stats(run: Run, spans: list[Span]) -> list[EpochStats]:
    """One EpochStats per window (see the module docstring for the definitions)."""
    wins = windows(run)
    tracks = Tracks(spans)
    rows = [_busy_stats(run, tracks, w) for w in wins]
    by_window = {w: r for w, r in zip(wins, rows, strict=True)}
    for e in run.events:
        w = epoch_of(wins, e["t"])
        if w is not None:
            _count(by_window[w], e)
    for e in run.of("epoch_generated", actor="coordinator"):
        w = next((w for w in wins if w.epoch == e.get("epoch") and w.epoch != SETUP), None)
        if w is not None:
            by_window[w].gen_s = e["t"] - w.start
    return rows


def _busy_stats(run: Run, tracks: Tracks, w: Window) -> EpochStats:
    row = EpochStats(w)
    trainers = [a for a in run.actors if run.role(a) == "trainer"]
    workers = run.workers()
    train = [iv for a in trainers for iv in tracks.get(a, ("train",)).within(w.start, w.end)]
    generate = [iv for a in workers for iv in tracks.get(a, ("generate",)).within(w.start, w.end)]
    row.overlap_s = total(intersect(train, generate))
    row.train_s = sum(tracks.seconds(a, ("train", "optimizer_step"), w.start, w.end) for a in trainers)
    row.upload_s = sum(tracks.seconds(a, ("weight_upload",), w.start, w.end) for a in trainers)
    for a in trainers:
        row.trainer_time, row.trainer_idle = _idle(run, tracks, a, w)
    for a in workers:
        present, idle = _idle(run, tracks, a, w)
        if present > 0:
            row.worker_time[a], row.worker_idle[a] = present, idle
            row.sync_s[a] = tracks.seconds(a, ("weight_sync",), w.start, w.end)
    return row


def _idle(run: Run, tracks: Tracks, actor: str, w: Window) -> tuple[float, float]:
    """(the actor's time in the window, the idle part of it)."""
    born, died = lifetime(run, actor)
    lo, hi = max(w.start, born), min(w.end, died)
    if hi <= lo:
        return 0.0, 0.0
    return hi - lo, hi - lo - tracks.seconds(actor, BUSY_SPANS.get(run.role(actor), ()), lo, hi)


def _count(row: EpochStats, e: Event) -> None:
    kind = e["event"]
    if kind == "group_accepted" and e.get("role") == "buffer":
        row.accepted += 1
    elif kind == "group_rejected":
        row.rejected[str(e.get("reason", "?"))] += 1
    elif kind == "member_join":
        row.joins.append(f"{e.get('member')} ({e.get('member_role')})")
    elif kind == "member_leave":
        row.leaves.append((str(e.get("member")), str(e.get("reason", ""))))
    elif kind == "requeue":
        row.requeued.append((str(e.get("worker")), list(e.get("groups", [])), str(e.get("reason", ""))))
