"""Deterministic replay of the Coordinator: feed a run's recorded inputs to a fresh CoordinatorCore.

The coordinator logs every input as `coord_input` (the message in full, or tick=True) before acting
on it. Replay rebuilds the core from RUN_DIR/config.yaml (as `topology.build_core` does), and for each
input sets `Core.now` to the recorded `now` (as `ActorHost._run` does), decodes the message with the
protocol's tagged union, feeds it, and compares what the core decided with what the log recorded
after that input:
- messages: the outbox (heartbeat acks excluded: they are not logged) against the `send` events, each
  as destination, type, epoch, version, reply_to, plus the assigned group ids (`assign`), the NoWork
  reason (`no_work`) and the Shutdown reason (`run_done`) where the log has them;
- state changes: the replayed core's own decision events (assign, requeue, epoch_open, joins, ...)
  against the recorded ones, every field but message ids and times.
Message ids are fresh in the replay, so the ids of recorded sends map onto the replayed ones and the
replies that come back as later inputs are rewritten (the buffer's Ack of epoch_open clears the
right pending request). A restarted coordinator (a second `actor_start`) restarts the replay, with
the epoch count and generation contract that coordinator logged (`coord_settings`: `--resume --epochs N`
may change the count; the contract is the one it refused workers by, whatever the files say today).
Events after a `bad_frame`, `unexpected_message`, `forbidden_message`, `send_failed` or
`stop_requested` belong to no input and are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from prl_actors.protocol.messages import GenerationContract, Message, Msg, NoWork, Shutdown, WorkAssign, tag_of
from prl_actors.records.logs import EventLog
from prl_actors.replay.events import Event, ReplayError, Run, run_config
from prl_actors.runtime.core import QUIET_TYPES
from prl_actors.transport.port import Dest, Inbound

DECISION_EVENTS = frozenset(
    {
        "assign",
        "no_work",
        "requeue",
        "epoch_open",
        "epoch_open_deferred",
        "epoch_open_retry",
        "epoch_generated",
        "sampling_round",
        "sampling_done",
        "epoch_done",
        "member_join",
        "member_leave",
        "late_accept_ignored",
        "request_timeout",
        "run_done",
        "scale",
        "handler_error",
        "group_refused",
        "given_back",
        "hold_expired",
        "group_given_up",
        "group_dropped",
        "member_expelled",
    }
)
ENDED = frozenset({"run_done", "stop_requested", "actor_stopped", "actor_crashed"})  # it ended on its own
VOLATILE = frozenset({"event", "actor", "role", "t_mono", "t_wall", "t", "where", "_seq", "msg_id", "trace"})
NOT_AN_INPUT = frozenset(
    {
        "bad_frame",
        "unexpected_message",
        "forbidden_message",
        "send_failed",
        "stop_requested",
        "actor_stopped",
        "actor_crashed",
    }
)  # refused before any handler (no coord_input): nothing to replay


class CaptureLog(EventLog):
    """An EventLog that keeps the replayed core's events in memory instead of writing them."""

    def __init__(self, actor: str) -> None:  # noqa: D107 - no file, no structlog
        self.actor, self.role = actor, "coordinator"
        self.epoch, self.version = -1, -1
        self.events: list[Event] = []

    def __call__(self, event: str, **fields: Any) -> None:
        fields.setdefault("epoch", self.epoch)
        fields.setdefault("version", self.version)
        self.events.append({"event": event, **fields})

    def close(self) -> None:
        pass


@dataclass
class Step:
    """One recorded input and what the log shows the coordinator did about it."""

    index: int
    event: Event
    recorded: list[Event] = field(default_factory=list)
    cut: bool = False  # the last input of a coordinator killed outright: it may have logged only a part


@dataclass
class Divergence:
    index: int
    input: str
    expected: str
    got: str

    def __str__(self) -> str:
        return f"input #{self.index} ({self.input}): expected {self.expected}, got {self.got}"


@dataclass
class CoordinatorReplay:
    inputs: int = 0
    decisions: int = 0
    divergence: Divergence | None = None


@dataclass
class Restart:
    """A (re)started coordinator: replay starts a fresh core, with the settings it logged."""

    settings: Event = field(default_factory=dict)


def recorded_steps(events: list[Event]) -> list[Step | Restart]:
    """The coordinator's inputs in log order, each (re)start (`actor_start`) marked by a Restart."""
    out: list[Step | Restart] = []
    current: Step | None = None
    restart: Restart | None = None
    inputs = 0
    ended = False  # the coordinator logged an end of its own since its last input
    for e in events:
        ended = ended or e["event"] in ENDED
        if e["event"] == "actor_start":
            _cut_short(out, ended)
            restart = Restart()
            out.append(restart)
            current = None
        elif e["event"] == "coord_settings" and restart is not None:
            restart.settings = e
        elif e["event"] == "coord_input":
            ended = False
            current = Step(inputs, e)
            out.append(current)
            inputs += 1
        elif e["event"] in NOT_AN_INPUT:
            current = None
        elif current is not None and (e["event"] == "send" or e["event"] in DECISION_EVENTS):
            current.recorded.append(e)
    _cut_short(out, ended)
    return out


def _cut_short(out: list[Step | Restart], ended: bool) -> None:
    """The coordinator whose inputs `out` ends with stopped here: when it logged no end of its own
    (SIGKILL), its last input may have been handled only in part (`Step.cut`)."""
    last = out[-1] if out else None
    if isinstance(last, Step) and not ended:
        last.cut = True


def new_core(run: Run, settings: Event | None = None) -> Any:
    """A fresh CoordinatorCore built from RUN_DIR/config.yaml (with the epoch count the recorded
    coordinator logged, when it did), logging into a CaptureLog."""
    from prl_actors.coordinator.core import CoordinatorCore
    from prl_actors.launch.topology import build_core
    from prl_actors.sections import ConfigError

    cfg = run_config(run.run_dir)
    if cfg is None:
        raise ReplayError(f"no config.yaml in {str(run.run_dir)!r}: the coordinator replay needs the run's config")
    try:
        core = build_core("coordinator", cfg, CaptureLog("coordinator"))
    except ConfigError as exc:
        raise ReplayError(f"cannot rebuild the coordinator from config.yaml: {exc}") from None
    assert isinstance(core, CoordinatorCore)
    if settings and "epochs" in settings:
        core.s.epochs = int(settings["epochs"])
    if settings and settings.get("contract") is not None:  # the run's, as logged: who may join does not
        core.s.contract = msgspec.convert(settings["contract"], GenerationContract)  # depend on today's files
    if core.eval_plan is not None:  # evaluation: what the recorded coordinator had done, and no files written
        from prl_actors.coordinator.evaluation import MemoryEvalSink

        core.eval_plan.done = {int(e) for e in (settings or {}).get("eval_done", [])}
        core.eval_sink = MemoryEvalSink()
    return core


def decode_input(e: Event, ids: dict[str, str]) -> Inbound:
    """The recorded message as the typed message the coordinator got, reply_to mapped to replay ids."""
    try:
        msg: Msg = msgspec.convert(_nan_floats(e["msg"]), Message)  # type: ignore[arg-type]
    except (msgspec.ValidationError, KeyError, TypeError) as exc:
        raise ReplayError(f"{e.get('where')}: coord_input message does not decode: {exc}") from None
    reply_to = getattr(msg, "reply_to", "")
    if reply_to in ids:
        msg = msgspec.structs.replace(msg, reply_to=ids[reply_to])  # type: ignore[call-arg]
    identity = bytes.fromhex(str(e.get("identity", "")))
    principal = str(e.get("principal", ""))  # the authenticated sender, so refusals replay as refusals
    return Inbound(msg, [], None, identity, principal=principal)  # type: ignore[arg-type]


def _nan_floats(raw: Any) -> Any:
    """JSON has no NaN: the log wrote a non-finite metric as null; read it back as NaN (a step_done's
    metrics are the only floats of a coordinator input that can be non-finite)."""
    if isinstance(raw, dict) and isinstance(raw.get("metrics"), dict):
        metrics = {k: float("nan") if v is None else v for k, v in raw["metrics"].items()}
        return {**raw, "metrics": metrics}
    return raw


def feed(core: Any, step: Step, ids: dict[str, str]) -> None:
    """One input into the core, exactly as ActorHost._run does it (exceptions become handler_error)."""
    e = step.event
    core.now = now = float(e["now"])
    try:
        if e.get("tick"):
            core.tick(now)
        else:
            core.handle(now, decode_input(e, ids))
    except ReplayError:
        raise
    except Exception as exc:  # the real host logs these and keeps going; so does the replay
        core.log("handler_error", error=f"{type(exc).__name__}: {exc}")


def outbox_decision(dest: Dest, msg: Msg) -> tuple[str, str | None]:
    tag = tag_of(msg)
    base = f"send {tag} -> {dest!r} e{msg.epoch} v{msg.version} reply_to={getattr(msg, 'reply_to', '') or '-'}"
    detail = None
    if isinstance(msg, WorkAssign):
        detail = f"groups={[p.group_id for p in msg.prompts]}"
    elif isinstance(msg, (NoWork, Shutdown)):
        detail = f"reason={msg.reason}"
    return base, detail


def logged_decision(send: Event, segment: list[Event]) -> tuple[str, str | None]:
    tag = send.get("type")
    base = f"send {tag} -> {send.get('to')} e{send.get('msg_epoch')} v{send.get('msg_version')} "
    base += f"reply_to={send.get('reply_to') or '-'}"
    detail = None
    for e in segment:
        if tag == "work_assign" and e["event"] == "assign" and e.get("msg_id") == send.get("msg_id"):
            detail = f"groups={list(e.get('groups', []))}"
        if tag == "no_work" and e["event"] == "no_work" and e.get("request_id") == send.get("reply_to"):
            detail = f"reason={e.get('reason')}"
        if tag == "shutdown" and e["event"] == "run_done":
            detail = f"reason={e.get('reason')}"
    return base, detail


def state_decision(e: Event) -> str:
    fields = " ".join(f"{k}={v}" for k, v in sorted(e.items()) if k not in VOLATILE)
    return f"{e['event']} {fields}".rstrip()


def describe_input(e: Event) -> str:
    if e.get("tick"):
        return f"tick at now={e.get('now')}"
    msg = e.get("msg") or {}
    return f"{msg.get('type')} {msg.get('id')} from {msg.get('sender')}"


def _first_difference(rec: list[str], got: list[str]) -> tuple[str, str] | None:
    for i in range(max(len(rec), len(got))):
        a = rec[i] if i < len(rec) else "(nothing more)"
        b = got[i] if i < len(got) else "(nothing more)"
        if a != b:
            return a, b
    return None


def _texts(rec: list[tuple[str, str | None]], got: list[tuple[str, str | None]]) -> tuple[list[str], list[str]]:
    """Decisions as comparable text; a detail the log does not have (older logs) is left out of both."""
    rec_t, got_t = [], []
    for i in range(max(len(rec), len(got))):
        want = rec[i][1] if i < len(rec) else "?"
        if i < len(rec):
            rec_t.append(" ".join(x for x in rec[i] if x))
        if i < len(got):
            got_t.append(" ".join(x for x in (got[i][0], got[i][1] if want else None) if x))
    return rec_t, got_t


def compare(
    step: Step, core: Any, log: CaptureLog, ids: dict[str, str], unlogged: frozenset[str] = frozenset()
) -> tuple[int, Divergence | None]:
    """(decisions compared, the first divergence of this input or None); updates the id map."""
    out = [(d, m) for d, m, _ in core.outbox if tag_of(m) not in QUIET_TYPES]
    sends = [e for e in step.recorded if e["event"] == "send"]
    for s, (_, msg) in zip(sends, out, strict=False):
        ids[str(s.get("msg_id"))] = msg.id
    rec, got = _texts([logged_decision(s, step.recorded) for s in sends], [outbox_decision(d, m) for d, m in out])
    rec += [state_decision(e) for e in step.recorded if e["event"] in DECISION_EVENTS]
    got += [state_decision(e) for e in log.events if e["event"] in DECISION_EVENTS - unlogged]
    if step.cut:  # killed while handling it: what it logged must be what the replay decides first
        got = got[: len(rec)]
    diff = _first_difference(rec, got)
    if diff is None:
        return len(rec), None
    return len(rec), Divergence(step.index, describe_input(step.event), *diff)


def _not_logged_yet(events: list[Event]) -> frozenset[str]:
    """Decision events a log from an older coordinator lacks (`no_work` came after `send` no_work)."""
    kinds = {e["event"] for e in events}
    no_work_sent = any(e["event"] == "send" and e.get("type") == "no_work" for e in events)
    return frozenset({"no_work"}) if no_work_sent and "no_work" not in kinds else frozenset()


def replay_coordinator(run: Run) -> CoordinatorReplay:
    """Feed every recorded input to a fresh core; stop at the first divergence."""
    report = CoordinatorReplay()
    core: Any = None
    ids: dict[str, str] = {}
    events = run.by_actor.get("coordinator", [])
    unlogged = _not_logged_yet(events)
    for step in recorded_steps(events):
        if isinstance(step, Restart):
            core, ids = new_core(run, step.settings), {}
            continue
        core = core or new_core(run)
        core.outbox, core.log.events = [], []
        feed(core, step, ids)
        n, divergence = compare(step, core, core.log, ids, unlogged)
        report.inputs += 1
        report.decisions += n
        if divergence is not None:
            report.divergence = divergence
            break
    return report
