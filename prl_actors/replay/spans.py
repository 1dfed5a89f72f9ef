"""Busy spans from `span_begin`/`span_end` events, and the interval arithmetic for idle and overlap.

Spans (per actor): worker `generate`, `score`, `weight_sync`; trainer `train`, `optimizer_step`,
`weight_upload`. Pairing rules: a `span_end` closes the open span of the same actor and name; a second
`span_begin` while one is open (a retried fetch or upload) extends the open span instead of nesting;
`generate_failed` ends an open `generate` span (marked `failed`); a span still open when the actor's
log ends is closed at its last event and marked `unclosed`.
Intervals are (begin, end) pairs in run seconds; the helpers return disjoint, sorted intervals.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prl_actors.replay.events import Event, Run

Interval = tuple[float, float]
BUSY_SPANS = {
    "worker": ("generate", "score", "weight_sync"),
    "trainer": ("train", "optimizer_step", "weight_upload"),
}

ABORTS = {"generate_failed": "generate"}  # events that end an open span without its span_end


@dataclass(frozen=True)
class Span:
    actor: str
    name: str
    begin: float
    end: float
    fields: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    unclosed: bool = False

    @property
    def seconds(self) -> float:
        return self.end - self.begin


def pair_spans(run: Run) -> list[Span]:
    """Every span of the run, sorted by begin time."""
    spans: list[Span] = []
    for actor, events in run.by_actor.items():
        spans += _actor_spans(actor, events)
    return sorted(spans, key=lambda s: (s.begin, s.actor))


def _actor_spans(actor: str, events: list[Event]) -> list[Span]:
    open_: dict[str, Event] = {}
    out: list[Span] = []
    for e in events:
        name = e.get("span")
        if e["event"] == "span_begin" and isinstance(name, str):
            open_.setdefault(name, e)
        elif e["event"] == "span_end" and isinstance(name, str) and name in open_:
            begin = open_.pop(name)
            out.append(Span(actor, name, begin["t"], e["t"], _fields(begin, e)))
        elif e["event"] in ABORTS and ABORTS[e["event"]] in open_:
            begin = open_.pop(ABORTS[e["event"]])
            out.append(Span(actor, begin["span"], begin["t"], e["t"], _fields(begin, e) | {"failed": True}))
    last = events[-1]["t"] if events else 0.0
    out += [Span(actor, n, b["t"], max(b["t"], last), _fields(b, b), unclosed=True) for n, b in open_.items()]
    return out


def _fields(begin: Event, end: Event) -> dict[str, Any]:
    skip = {"event", "actor", "role", "t_mono", "t_wall", "t", "where", "_seq", "span"}
    merged = {k: v for k, v in begin.items() if k not in skip}
    merged.update({k: v for k, v in end.items() if k not in skip})
    return merged


def union(intervals: list[Interval]) -> list[Interval]:
    """Disjoint, sorted cover of `intervals`."""
    out: list[Interval] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        elif hi > lo:
            out.append((lo, hi))
    return out


def clip(intervals: list[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def total(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in union(intervals))


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The intervals covered by both `a` and `b`."""
    out: list[Interval] = []
    ua, ub = union(a), union(b)
    i = j = 0
    while i < len(ua) and j < len(ub):
        lo, hi = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        if hi > lo:
            out.append((lo, hi))
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return out


def gaps(busy: list[Interval], lo: float, hi: float) -> list[Interval]:
    """The parts of [lo, hi) not covered by `busy`: the idle (bubble) intervals."""
    out: list[Interval] = []
    cursor = lo
    for a, b in clip(union(busy), lo, hi):
        if a > cursor:
            out.append((cursor, a))
        cursor = max(cursor, b)
    if hi > cursor:
        out.append((cursor, hi))
    return out


class Track:
    """Disjoint, sorted intervals that clip to a window in O(log n + k) (many epochs, many spans)."""

    def __init__(self, ivs: list[Interval]) -> None:
        self.ivs = union(ivs)
        self.ends = [b for _, b in self.ivs]

    def within(self, lo: float, hi: float) -> list[Interval]:
        out = []
        for a, b in self.ivs[bisect_right(self.ends, lo) :]:
            if a >= hi:
                break
            out.append((max(a, lo), min(b, hi)))
        return out


def intervals(spans: list[Span], actor: str | None = None, names: tuple[str, ...] | None = None) -> list[Interval]:
    """The (begin, end) of the spans of `actor` (any when None) named one of `names` (any when None)."""
    return [
        (s.begin, s.end) for s in spans if (actor is None or s.actor == actor) and (names is None or s.name in names)
    ]


def lifetime(run: Run, actor: str) -> Interval:
    """From the actor's first to its last event."""
    events = run.by_actor.get(actor, [])
    return (events[0]["t"], events[-1]["t"]) if events else (0.0, 0.0)
