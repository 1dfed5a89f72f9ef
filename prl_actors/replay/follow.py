"""Event filters (`--filter key=value`), one-line event formatting, and `--follow` (tail a live run).

Filters: `actor=NAME` (shell wildcards allowed: worker-*), `epoch=N` (the actor's epoch or the
message's), `msg=ID` (msg_id, reply_to, request_id, transfer, or the id of a recorded coordinator
input), `event=NAME`, `type=MESSAGE_TYPE`. Repeating a key ORs its values; different keys AND.
Follow polls RUN_DIR/logs/*.jsonl (files appearing later, e.g. new workers, are picked up), prints
complete new lines as they arrive (each poll's batch in time order), and stops after the coordinator
logs `run_done` (one more poll to flush the others), on Ctrl-C, or at the timeout.
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from prl_actors.replay.events import Event, ReplayError, parse_line

KEYS = ("actor", "epoch", "msg", "event", "type")
MSG_FIELDS = ("msg_id", "reply_to", "request_id", "transfer")
HIDDEN = frozenset({"event", "actor", "role", "t_mono", "t_wall", "t", "where", "_seq", "epoch", "version"})


@dataclass
class Filter:
    values: dict[str, set[str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.values)

    def matches(self, e: Event) -> bool:
        return all(_MATCHERS[key](e, wanted) for key, wanted in self.values.items())


def _actor(e: Event, wanted: set[str]) -> bool:
    return any(fnmatch.fnmatchcase(str(e["actor"]), w) for w in wanted)


def _epoch(e: Event, wanted: set[str]) -> bool:
    return str(e.get("epoch")) in wanted or str(e.get("msg_epoch", "")) in wanted


def _msg(e: Event, wanted: set[str]) -> bool:
    ids = {str(e.get(k)) for k in MSG_FIELDS if e.get(k)}
    msg = e.get("msg")
    if isinstance(msg, dict):
        ids |= {str(msg.get("id")), str(msg.get("reply_to", ""))}
    return bool(ids & wanted)


_MATCHERS: dict[str, Callable[[Event, set[str]], bool]] = {
    "actor": _actor,
    "epoch": _epoch,
    "msg": _msg,
    "event": lambda e, w: e["event"] in w,
    "type": lambda e, w: str(e.get("type")) in w or str((e.get("msg") or {}).get("type")) in w,
}


def parse_filters(items: list[str]) -> Filter:
    """['actor=worker-0', 'epoch=2'] -> Filter (ReplayError on a malformed item)."""
    flt = Filter()
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value or key not in KEYS:
            raise ReplayError(f"bad --filter {item!r}: use KEY=VALUE with KEY one of {', '.join(KEYS)}")
        if key == "epoch" and not value.lstrip("-").isdigit():
            raise ReplayError(f"bad --filter {item!r}: epoch must be an integer")
        flt.values.setdefault(key, set()).add(value)
    return flt


def format_event(e: Event, t: float) -> str:
    """`  1.234567s worker-0       send                 e0 v0  type=work_request msg_id=...` (t: run seconds)"""
    fields = " ".join(f"{k}={_short(v)}" for k, v in e.items() if k not in HIDDEN)
    return f"{t:10.6f}s {e['actor']:<14} {e['event']:<20} e{e.get('epoch', '?')} v{e.get('version', '?')}  {fields}"


def _short(v: object, limit: int = 160) -> str:
    text = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clock(e: Event) -> float:
    """The event's monotonic time (its wall time if it has none)."""
    t = e.get("t_mono", e.get("t_wall"))
    return float(t) if isinstance(t, int | float) else 0.0


class Tail:
    """New complete lines of every RUN_DIR/logs/*.jsonl since the last poll."""

    def __init__(self, logs_dir: Path) -> None:
        self.logs_dir = logs_dir
        self.files: dict[Path, IO[str]] = {}
        self.partial: dict[Path, str] = {}
        self.lines: dict[Path, int] = {}

    def poll(self) -> list[Event]:
        for path in sorted(self.logs_dir.glob("*.jsonl")):
            if path not in self.files:
                self.files[path] = open(path, errors="replace")  # noqa: SIM115 - closed in close()
                self.partial[path], self.lines[path] = "", 0
        out: list[Event] = []
        for path, f in self.files.items():
            chunk = self.partial[path] + f.read()
            *complete, self.partial[path] = chunk.split("\n")
            for line in complete:
                self.lines[path] += 1
                if line.strip():
                    out.append(parse_line(line, f"{path.name}:{self.lines[path]}"))
        return sorted(out, key=clock)

    def close(self) -> None:
        for f in self.files.values():
            f.close()


@dataclass
class _Printer:
    flt: Filter
    emit: Callable[[str], None]
    t0: float | None = None

    def show(self, events: list[Event]) -> bool:
        """Print the matching events; True once the coordinator's `run_done` went by."""
        done = False
        for e in events:
            t = clock(e)
            self.t0 = t if self.t0 is None else self.t0
            done = done or (e["actor"] == "coordinator" and e["event"] == "run_done")
            if self.flt.matches(e):
                self.emit(format_event(e, t - self.t0))
        return done


def follow(run_dir: Path, flt: Filter, timeout_s: float, emit: Callable[[str], None], poll_s: float = 0.2) -> str:
    """Print the run's events as they are logged. Returns why it stopped: run_done, timeout, interrupted."""
    if not run_dir.is_dir():
        raise ReplayError(f"run dir {str(run_dir)!r} does not exist")
    tail, printer = Tail(run_dir / "logs"), _Printer(flt, emit)
    deadline = time.monotonic() + timeout_s
    try:
        while not printer.show(tail.poll()):
            if time.monotonic() >= deadline:
                return "timeout"
            time.sleep(poll_s)
        time.sleep(poll_s)  # the other actors log their shutdown just after run_done
        printer.show(tail.poll())
        return "run_done"
    except KeyboardInterrupt:
        return "interrupted"
    finally:
        tail.close()
