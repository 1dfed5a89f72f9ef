"""A run's logs as one ordered timeline: every RUN_DIR/logs/<actor>.jsonl file merged.

Invariants of a loaded `Run`:
- `events` holds every event of every actor, sorted by the run's clock, then actor, then line number,
  so events of one actor keep their logged order;
- the clock is `t_mono` when every event has it and every actor ran on one host (monotonic clocks are
  comparable only on one host), else `t_wall`;
- each event gets `t` (seconds since the run's first event on that clock) and `where` (file:line);
- an actor's `<actor>.jsonl.gz` (the logs of ended runs, when large: rundir.compress_logs) is read
  before its `<actor>.jsonl` (what a resumed run wrote since).
Bad input (no run dir, no logs, a line that is not a JSON object with `event` and `actor`) raises
`ReplayError` with one line for the user. A truncated last line (an actor killed mid-write) is
skipped with a note in `Run.notes`.
"""

from __future__ import annotations

import gzip
import json
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prl_actors.protocol.messages import role_prefix

if TYPE_CHECKING:
    from prl_actors.config import Config

Event = dict[str, Any]
ROLE_ORDER = ("coordinator", "publisher", "buffer", "trainer", "worker")
ENDING_EVENTS = frozenset({"shutdown", "stop_requested", "actor_crashed", "actor_stopped", "run_done"})


class ReplayError(Exception):
    """Bad input (run dir, logs, config): the message is one line meant for the user."""


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which check, a precise message naming actors, times and message ids."""

    check: str
    message: str


@dataclass
class Run:
    run_dir: Path
    events: list[Event]
    clock: str
    t0: float
    actors: list[str]
    notes: list[str] = field(default_factory=list)

    def of(self, *names: str, actor: str | None = None) -> list[Event]:
        """The events named `names` (of `actor`, if given), in timeline order."""
        wanted = set(names)
        return [e for e in self.events if e["event"] in wanted and (actor is None or e["actor"] == actor)]

    def role(self, actor: str) -> str:
        return self.roles.get(actor, role_prefix(actor))

    @cached_property
    def roles(self) -> dict[str, str]:
        return {e["actor"]: str(e.get("role", "")) for e in self.events if e.get("role")}

    def workers(self) -> list[str]:
        return [a for a in self.actors if self.role(a) == "worker"]

    @property
    def duration(self) -> float:
        return self.events[-1]["t"] if self.events else 0.0

    def mode(self) -> str:
        """periodic / sync, from RUN_DIR/config.yaml ("?" without a readable one)."""
        try:
            cfg = run_config(self.run_dir)
        except ReplayError:
            return "?"
        return cfg.run.mode if cfg is not None else "?"

    @cached_property
    def lifecycles(self) -> dict[str, Lifecycle]:
        return lifecycles(self)

    @cached_property
    def by_actor(self) -> dict[str, list[Event]]:
        out: dict[str, list[Event]] = defaultdict(list)
        for e in self.events:
            out[e["actor"]].append(e)
        return out


def run_config(run_dir: Path) -> Config | None:
    """The resolved config `up` wrote to RUN_DIR/config.yaml, or None when there is none."""
    from prl_actors.config import load_config
    from prl_actors.sections import ConfigError

    path = run_dir / "config.yaml"
    if not path.exists():
        return None
    try:
        return load_config(path)
    except ConfigError as exc:
        raise ReplayError(f"{path}: {exc}") from None


def at(e: Event) -> str:
    """`actor +1.234s` (plus the message id when the event has one): how a report names an event."""
    text = f"{e['actor']} +{e['t']:.3f}s"
    mid = e.get("msg_id") or ""
    return f"{text} msg {mid}" if mid else text


def log_files(run_dir: Path) -> list[Path]:
    if not run_dir.exists():
        raise ReplayError(f"run dir {str(run_dir)!r} does not exist")
    if not run_dir.is_dir():
        raise ReplayError(f"{str(run_dir)!r} is not a directory")
    logs = run_dir / "logs"
    files = sorted([*logs.glob("*.jsonl"), *logs.glob("*.jsonl.gz")], key=_older_first)
    if not files:
        raise ReplayError(f"no logs in {str(run_dir / 'logs')!r} (expected <actor>.jsonl files)")
    return files


def _older_first(path: Path) -> tuple[str, int]:
    """An actor's compressed log (what ended runs wrote: rundir.compress_logs) before its plain one."""
    return path.name.removesuffix(".gz"), 0 if path.name.endswith(".gz") else 1


def parse_line(line: str, where: str) -> Event:
    """One log line -> an event dict, or ReplayError naming file and line."""
    try:
        event = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ReplayError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(event, dict) or not isinstance(event.get("event"), str) or "actor" not in event:
        raise ReplayError(f"{where}: not a log event (a JSON object with 'event' and 'actor')")
    if not isinstance(event.get("t_mono"), int | float) and not isinstance(event.get("t_wall"), int | float):
        raise ReplayError(f"{where}: event {event['event']!r} has neither t_mono nor t_wall")
    for key in ("epoch", "version"):
        event.setdefault(key, -1)
        if not isinstance(event[key], int):
            raise ReplayError(f"{where}: event {event['event']!r} has a non-integer {key} {event[key]!r}")
    if not isinstance(event["actor"], str) or not event["actor"]:
        raise ReplayError(f"{where}: event {event['event']!r} has no actor name")
    event["where"] = where
    return event


def read_file(path: Path, notes: list[str]) -> list[Event]:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt", errors="replace") as f:
            text = f.read()
    else:
        text = path.read_text(errors="replace")
    lines = text.split("\n")
    events = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name}:{i}"
        if i == len(lines) and not text.endswith("\n"):  # written in part: the actor died mid-line
            try:
                events.append(parse_line(line, where))
            except ReplayError:
                notes.append(f"{where}: skipped a truncated last line")
            continue
        events.append(parse_line(line, where))
    return events


def choose_clock(events: list[Event]) -> str:
    hosts = {e.get("host") for e in events if e["event"] == "actor_start" and e.get("host")}
    if len(hosts) <= 1 and all(isinstance(e.get("t_mono"), int | float) for e in events):
        return "t_mono"
    if all(isinstance(e.get("t_wall"), int | float) for e in events):
        return "t_wall"
    raise ReplayError("events of several hosts without t_wall on every event: no common clock to order them")


def order_actors(events: list[Event]) -> list[str]:
    """coordinator, publisher, buffer, trainer, then workers by name (and anything else last)."""
    roles = {e["actor"]: str(e.get("role") or role_prefix(e["actor"])) for e in events}

    def key(actor: str) -> tuple[int, str]:
        role = roles[actor]
        return (ROLE_ORDER.index(role) if role in ROLE_ORDER else len(ROLE_ORDER), actor)

    return sorted(roles, key=key)


def merge(events: list[Event], run_dir: Path, notes: list[str] | None = None) -> Run:
    """Order `events` on one clock and number their times from the first one."""
    if not events:
        raise ReplayError(f"the logs in {str(run_dir / 'logs')!r} hold no events")
    clock = choose_clock(events)
    actors = order_actors(events)
    rank = {a: i for i, a in enumerate(actors)}
    seq: dict[str, int] = defaultdict(int)
    for e in events:  # keep each actor's own order even when two events share a timestamp
        e["_seq"] = seq[e["actor"]]
        seq[e["actor"]] += 1
    events.sort(key=lambda e: (e[clock], rank[e["actor"]], e["_seq"]))
    t0 = events[0][clock]
    for e in events:
        e["t"] = e[clock] - t0
    return Run(run_dir, events, clock, t0, actors, notes or [])


def load_run(run_dir: Path) -> Run:
    """Read and merge every actor's log in RUN_DIR/logs (ReplayError on bad input)."""
    notes: list[str] = []
    events: list[Event] = []
    for path in log_files(run_dir):
        try:
            events += read_file(path, notes)
        except (OSError, EOFError) as exc:  # EOFError, BadGzipFile: a damaged .gz
            raise ReplayError(f"cannot read {str(path)!r}: {getattr(exc, 'strerror', None) or exc}") from None
    return merge(events, run_dir, notes)


@dataclass(frozen=True)
class Lifecycle:
    """When one actor started (each incarnation), stopped taking messages, and logged."""

    starts: list[float]
    ends: list[float]  # ending events, and the coordinator's sending it Shutdown
    times: list[float]  # every event's time, in order (at least one)

    @property
    def first(self) -> float:
        return self.times[0]

    def last_before(self, until: float) -> float:
        """The time of its last event before `until` (its first event when none is)."""
        i = bisect_left(self.times, until)
        return self.times[i - 1] if i else self.first


def lifecycles(run: Run) -> dict[str, Lifecycle]:
    told: dict[str, list[float]] = defaultdict(list)
    for e in run.by_actor.get("coordinator", []):
        if e["event"] == "send" and e.get("type") == "shutdown":
            told[str(e.get("to", "")).removeprefix("id:")].append(e["t"])
    out = {}
    for actor, mine in run.by_actor.items():
        starts = [e["t"] for e in mine if e["event"] == "actor_start"]
        ends = sorted([e["t"] for e in mine if e["event"] in ENDING_EVENTS] + told[actor])
        out[actor] = Lifecycle(starts, ends, [e["t"] for e in mine])
    return out


def ending_time(run: Run, actor: str, after: float) -> float:
    """When `actor` stopped taking messages, for the incarnation alive at time `after`: the first of its
    ending events (shutdown, stop, crash, run_done) and the coordinator's sending it Shutdown (from then
    on, what arrives may never be handled), else its last event before the next incarnation started
    (one killed outright logs no ending: SIGKILL); +inf for an actor without a log."""
    life = run.lifecycles.get(actor)
    if life is None:
        return float("inf")
    i = bisect_right(life.starts, after)
    since = life.starts[i - 1] if i else life.first
    until = life.starts[i] if i < len(life.starts) else float("inf")
    j = bisect_left(life.ends, since)
    if j < len(life.ends) and life.ends[j] < until:
        return life.ends[j]
    return life.last_before(until)
