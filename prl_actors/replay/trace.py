"""Chrome / Perfetto trace of a run (trace-event JSON): open it in ui.perfetto.dev or chrome://tracing.

Layout: one process (pid) per actor, named by `process_name` metadata and ordered coordinator,
publisher, buffer, trainer, workers; its spans on thread (tid) 1, or 2, 3 ... when a span overlaps an
earlier one of the same actor (an asynchronous weight upload while training), since complete ("X")
events on one thread must nest. Idle (bubble) intervals of the trainer and the workers are "X" events
named `idle`. Epoch boundaries are global instant events; joins, leaves, requeues, rejections and
timeouts are instant events on the actor's track. Times are microseconds since the run's first event.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prl_actors.replay.epochs import SETUP, Window, windows
from prl_actors.replay.spans import BUSY_SPANS, Span, gaps, intervals, lifetime, pair_spans

if TYPE_CHECKING:
    from prl_actors.replay.events import Event, Run

INSTANTS = frozenset(
    {
        "member_join",
        "member_leave",
        "requeue",
        "group_rejected",
        "request_timeout",
        "handler_error",
        "weight_sync_failed",
        "transfer_failed",
        "epoch_generated",
        "run_done",
    }
)
TraceEvent = dict[str, Any]


def _us(t: float) -> float:
    return round(t * 1e6, 3)


def metadata(run: Run) -> list[TraceEvent]:
    out: list[TraceEvent] = []
    for i, actor in enumerate(run.actors):
        pid = i + 1
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 1, "args": {"name": actor}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 1, "args": {"sort_index": i}})
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": run.role(actor)}})
    return out


def lanes(spans: list[Span]) -> list[tuple[Span, int]]:
    """Each span with a tid (1, 2, ...): the first lane whose last span ended before this one began."""
    ends: list[float] = []
    out = []
    for s in sorted(spans, key=lambda s: (s.begin, -s.end)):
        lane = next((i for i, end in enumerate(ends) if end <= s.begin), len(ends))
        if lane == len(ends):
            ends.append(s.end)
        else:
            ends[lane] = s.end
        out.append((s, lane + 1))
    return out


def span_events(run: Run, spans: list[Span]) -> list[TraceEvent]:
    pid = {a: i + 1 for i, a in enumerate(run.actors)}
    out: list[TraceEvent] = []
    for actor in run.actors:
        for s, tid in lanes([s for s in spans if s.actor == actor]):
            args = {k: v for k, v in s.fields.items() if isinstance(v, str | int | float | bool | list)}
            out.append(
                {"ph": "X", "name": s.name, "cat": s.name, "pid": pid[actor], "tid": tid, "ts": _us(s.begin)}
                | {"dur": _us(s.seconds), "args": args | ({"unclosed": True} if s.unclosed else {})}
            )
    return out


def idle_events(run: Run, spans: list[Span], wins: list[Window]) -> list[TraceEvent]:
    """The trainer's and every worker's idle intervals, per epoch window."""
    out: list[TraceEvent] = []
    for i, actor in enumerate(run.actors):
        names = BUSY_SPANS.get(run.role(actor))
        if names is None:
            continue
        born, died = lifetime(run, actor)
        busy = intervals(spans, actor, names)
        for w in wins:
            if w.epoch == SETUP:
                continue
            for a, b in gaps(busy, max(w.start, born), min(w.end, died)):
                event = {"ph": "X", "name": "idle", "cat": "idle", "pid": i + 1, "tid": 1, "ts": _us(a)}
                out.append(event | {"dur": _us(b - a), "args": {"epoch": w.epoch}})
    return out


def instant_events(run: Run, wins: list[Window]) -> list[TraceEvent]:
    pid = {a: i + 1 for i, a in enumerate(run.actors)}
    coord = pid.get("coordinator", 1)
    out: list[TraceEvent] = [
        {"ph": "i", "s": "g", "name": f"epoch {w.epoch} (v{w.version})", "pid": coord, "tid": 1, "ts": _us(w.start)}
        for w in wins
        if w.epoch != SETUP
    ]
    for e in run.events:
        if e["event"] in INSTANTS:
            out.append(
                {"ph": "i", "s": "t", "name": _instant_name(e), "pid": pid[e["actor"]], "tid": 1, "ts": _us(e["t"])}
                | {"args": _args(e)}
            )
    return out


def _instant_name(e: Event) -> str:
    for key in ("member", "reason", "worker"):
        if e.get(key):
            return f"{e['event']} {e[key]}"
    return str(e["event"])


def _args(e: Event) -> dict[str, Any]:
    skip = {"event", "actor", "role", "t_mono", "t_wall", "t", "_seq", "trace"}
    return {k: v for k, v in e.items() if k not in skip and isinstance(v, str | int | float | bool | list)}


def build_trace(run: Run, spans: list[Span] | None = None) -> dict[str, Any]:
    """The trace as a JSON-ready dict ({"traceEvents": [...], ...})."""
    spans = pair_spans(run) if spans is None else spans
    wins = windows(run)
    events = metadata(run) + span_events(run, spans) + idle_events(run, spans, wins) + instant_events(run, wins)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"run_dir": str(run.run_dir)}}


def write_trace(run: Run, path: Path, spans: list[Span] | None = None) -> int:
    """Write the trace to `path`; returns the number of trace events."""
    trace = build_trace(run, spans)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace))
    return len(trace["traceEvents"])
