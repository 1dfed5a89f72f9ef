"""The timeline's time axis: cropped to a range of epochs, with long idle gaps folded.

A resumed run has a gap (the time between the stop and the resume, 111 s in one measured run) in
which no actor logs anything; drawn to scale it squeezes the epochs around it into slivers. The axis
keeps every stretch of activity to scale and draws each gap longer than `fold_threshold` as a
short band of fixed width, labelled with its real length.

Invariants: `x` is continuous and non-decreasing over the kept range; within a kept stretch it is a
shift of real time (durations are exact); a folded gap takes `fold_width` seconds of the axis.
"""

from __future__ import annotations

import statistics
from bisect import bisect_right
from dataclasses import dataclass, field

from prl_actors.replay.epochs import SETUP, windows
from prl_actors.replay.events import ReplayError, Run
from prl_actors.replay.spans import Interval, Span, union

FOLD_MIN_S = 2.0  # never fold a gap shorter than this
FOLD_EPOCHS = 5.0  # ... or shorter than this many median epochs


@dataclass
class TimeAxis:
    lo: float  # the real time range shown
    hi: float
    gaps: list[Interval] = field(default_factory=list)  # folded, sorted, within [lo, hi]
    fold_width: float = 0.0

    def x(self, t: float) -> float:
        """Axis position of real time `t` (clamped to the shown range)."""
        t = min(max(t, self.lo), self.hi)
        x = t - self.lo
        for a, b in self.gaps:
            if t <= a:
                break
            inside = min(t, b) - a
            x -= inside - self.fold_width * inside / (b - a)
        return x

    @property
    def width(self) -> float:
        return self.x(self.hi)

    def shows(self, begin: float, end: float) -> bool:
        return end >= self.lo and begin <= self.hi


def parse_epochs(text: str) -> tuple[int | None, int | None]:
    """'3:7' -> (3, 7) (both inclusive), '3:' -> (3, None), ':7' -> (None, 7), '5' -> (5, 5)."""
    lo, sep, hi = text.partition(":")
    try:
        first = int(lo) if lo.strip() else None
        last = (int(hi) if hi.strip() else None) if sep else first
    except ValueError:
        raise ReplayError(f"--epochs {text!r}: expected A:B, A:, :B or A (epoch numbers)") from None
    if first is not None and last is not None and last < first:
        raise ReplayError(f"--epochs {text!r}: the last epoch is before the first")
    return first, last


def time_axis(run: Run, spans: list[Span], epochs: tuple[int | None, int | None] = (None, None)) -> TimeAxis:
    """The axis over the epochs `epochs` (inclusive; None: from the start / to the end of the run),
    with idle gaps longer than max(FOLD_MIN_S, FOLD_EPOCHS median epochs) folded."""
    wins = [w for w in windows(run) if w.epoch != SETUP]
    first, last = epochs
    lo, hi = 0.0, max(run.duration, 1e-3)
    if first is not None or last is not None:
        chosen = [w for w in wins if (first is None or w.epoch >= first) and (last is None or w.epoch <= last)]
        if not chosen:
            have = f"{wins[0].epoch}..{wins[-1].epoch}" if wins else "none"
            raise ReplayError(f"--epochs {first}:{last}: no such epoch in this run (epochs {have})")
        lo = chosen[0].start if first is not None else lo
        hi = max(w.end for w in chosen) if last is not None else hi
    walls = [w.wall for w in wins if w.wall > 0]
    median = statistics.median(walls) if walls else 0.0
    threshold = max(FOLD_MIN_S, FOLD_EPOCHS * median)
    busy = union([(s.begin, max(s.end, s.begin + 1e-9)) for s in spans] + [(e["t"], e["t"] + 1e-9) for e in run.events])
    gaps = [(a, b) for a, b in _holes(busy, lo, hi) if b - a > threshold]
    return TimeAxis(lo, hi, gaps, fold_width=max(median, threshold / 10))


def _holes(busy: list[Interval], lo: float, hi: float) -> list[Interval]:
    """The stretches of [lo, hi] that no interval of `busy` (sorted, disjoint) covers."""
    out, at = [], lo
    start = max(0, bisect_right([b for _, b in busy], lo) - 1)
    for a, b in busy[start:]:
        if a > hi:
            break
        if a > at:
            out.append((at, min(a, hi)))
        at = max(at, b)
    if at < hi:
        out.append((at, hi))
    return out
