"""Coordinator: the epoch state machine, membership, and the epoch's work queue.

Invariants it keeps:
- epoch e is bound to weights v_e (= e: one optimizer step per epoch, versions start at 0);
- a worker is given epoch-e work only when its WorkRequest says it holds v_e;
- every group of the epoch is either queued, held by exactly one live worker, or done (accepted by
  the buffer); a leaving or silent worker's held groups go back to the queue; a done group is never
  handed out again.
Every input (message or effective tick) is logged as `coord_input` with the message in full, so
`prl-actors replay` can feed a run's inputs back into this class and compare its decisions.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import msgspec

from prl_actors.actors.runtime import Core
from prl_actors.logs import EventLog
from prl_actors.protocol.messages import (
    Ack,
    EpochOpen,
    EpochStart,
    Error,
    HeartbeatAck,
    MemberInfo,
    Msg,
    NoWork,
    Prompt,
    Shutdown,
    Status,
    Welcome,
    WorkAssign,
    new_id,
)
from prl_actors.tasks.base import Task
from prl_actors.transport.port import Dest, Inbound

STALL_LOG_S = 10.0  # how often a stalled coordinator says why it waits


@dataclass
class CoordinatorSettings:
    run_id: str
    mode: str
    epochs: int
    groups_per_epoch: int
    group_size: int
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    max_groups_per_request: int
    publisher_addr: str
    buffer_addr: str
    request_timeout_s: float = 10.0
    desired_workers: int = -1


@dataclass
class Member:
    name: str
    role: str
    identity: bytes
    last_seen: float
    version: int = -1
    outstanding: set[int] = field(default_factory=set)


class CoordinatorCore(Core):
    role = "coordinator"

    def __init__(self, name: str, log: EventLog, settings: CoordinatorSettings, task: Task) -> None:
        super().__init__(name, log)
        self.s, self.task = settings, task
        self.members: dict[str, Member] = {}
        self.state = "waiting_weights"  # -> opening -> running -> training -> (opening ... | done)
        self.available_version = -1
        self.prompts: dict[int, Prompt] = {}
        self.queue: deque[int] = deque()
        self.holder: dict[int, str] = {}  # group id -> worker holding it
        self.done: set[int] = set()
        self.waiting: set[str] = set()  # workers told "queue_empty", nudged when work returns
        self.epochs_completed = 0
        self._progress: tuple[str, int, int] = ("", -1, -1)
        self._progress_at = 0.0
        self.stall_reason = ""
        self._open_id = ""  # the EpochOpen whose Ack opens the epoch

    # --- inputs ------------------------------------------------------------------------------

    def handle(self, now: float, inbound: Inbound) -> None:
        self.log(
            "coord_input",
            now=now,
            identity=inbound.identity.hex(),
            msg=msgspec.to_builtins(inbound.msg),
        )
        member = self.members.get(inbound.msg.sender)
        if member is not None:
            member.last_seen = now
        super().handle(now, inbound)

    def tick(self, now: float) -> None:
        silent = [m for m in self.members.values() if now - m.last_seen > self.s.heartbeat_timeout_s]
        if silent or any(p.deadline <= now for p in self._pending.values()):  # a tick that decides something
            self.log("coord_input", now=now, tick=True)  # logged before its effects, which replay compares
        super().tick(now)
        for m in silent:
            self._remove(m, "heartbeat_timeout", now)
        self._watch_stall(now)

    def _watch_stall(self, now: float) -> None:
        """No silent hang: while an epoch makes no progress, say every STALL_LOG_S why we wait."""
        progress = (self.state, self.epoch, len(self.done))
        if progress != self._progress:
            self._progress, self._progress_at, self.stall_reason = progress, now, ""
            return
        if self.state in ("done", "training") or now - self._progress_at < STALL_LOG_S:
            return
        self._progress_at = now
        workers = [m for m in self.members.values() if m.role == "worker"]
        reason = self._stall_reason(workers)
        self.log("stalled", reason=reason, state=self.state, queued=len(self.queue), held=len(self.holder))
        self.stall_reason = reason

    def _stall_reason(self, workers: list[Member]) -> str:
        if self.state == "waiting_weights":
            return "waiting for the trainer's weights (publisher: weights_available)"
        if self.state == "opening":
            return "waiting for the buffer to ack epoch_open"
        if not workers:
            return "no worker is registered"
        behind = [m.name for m in workers if m.version != self.epoch]
        if len(behind) == len(workers):
            return f"every worker still holds an older version ({', '.join(sorted(behind)[:4])})"
        return f"{len(self.holder)} groups held by workers, {len(self.queue)} queued"

    # --- membership --------------------------------------------------------------------------

    def on_register(self, now: float, inbound: Inbound) -> None:
        msg = inbound.msg
        old = self.members.get(msg.sender)
        if old is not None:  # a restarted process under the same name: its old work is lost
            self._remove(old, "re_registered", now)
        self.members[msg.sender] = Member(msg.sender, msg.role, inbound.identity, now)
        self.log("member_join", member=msg.sender, member_role=msg.role, pid=msg.pid, host=msg.host)
        if msg.role == "buffer" and self.state == "waiting_weights":
            self._maybe_open()
        self.reply(
            inbound,
            Welcome(
                reply_to=msg.id,
                epoch=self.epoch if self.state in ("running", "training") else -1,
                version=self.epoch if self.state in ("running", "training") else -1,
                run_id=self.s.run_id,
                mode=self.s.mode,
                group_size=self.s.group_size,
                groups_per_epoch=self.s.groups_per_epoch,
                heartbeat_interval_s=self.s.heartbeat_interval_s,
                publisher_addr=self.s.publisher_addr,
                buffer_addr=self.s.buffer_addr,
            ),
        )

    def on_heartbeat(self, now: float, inbound: Inbound) -> None:
        member = self.members.get(inbound.msg.sender)
        if member is not None:
            member.version = inbound.msg.version
        epoch = self.epoch if self.state in ("running", "training") else -1
        ack = HeartbeatAck(reply_to=inbound.msg.id, known=member is not None, epoch=epoch, version=epoch)
        self.reply(inbound, ack)

    def on_leave(self, now: float, inbound: Inbound) -> None:
        member = self.members.get(inbound.msg.sender)
        if member is not None:
            self._remove(member, f"leave:{inbound.msg.reason}" if inbound.msg.reason else "leave", now)
        self.reply(inbound, Ack(reply_to=inbound.msg.id))

    def _remove(self, member: Member, reason: str, now: float) -> None:
        del self.members[member.name]
        self.waiting.discard(member.name)
        self.log("member_leave", member=member.name, member_role=member.role, reason=reason)
        lost = sorted(g for g in member.outstanding if g not in self.done)
        if lost:
            self._requeue(lost, member.name, reason)

    def _requeue(self, groups: list[int], worker: str, reason: str) -> None:
        for g in groups:
            self.holder.pop(g, None)
        self.queue.extendleft(reversed(groups))  # back at the front: oldest work first
        self.log("requeue", worker=worker, groups=groups, reason=reason)
        for name in sorted(self.waiting):
            self._to_member(name, EpochStart(epoch=self.epoch, version=self.epoch, groups=self.s.groups_per_epoch))
        self.waiting.clear()

    # --- work --------------------------------------------------------------------------------

    def on_work_request(self, now: float, inbound: Inbound) -> None:
        msg = inbound.msg
        member = self.members.get(msg.sender)
        if member is None or member.role != "worker":
            self.reply(inbound, Error(reply_to=msg.id, code="rejected", detail="register as a worker first"))
            return
        member.version = msg.version
        reason = self._no_work_reason(msg.version)
        if reason:
            self.reply(inbound, NoWork(reply_to=msg.id, reason=reason, epoch=self.epoch, version=self.epoch))
            self.log("no_work", worker=member.name, reason=reason, request_id=msg.id)
            if reason == "queue_empty":
                self.waiting.add(member.name)
            return
        n = min(msg.max_groups, self.s.max_groups_per_request, len(self.queue))
        groups = [self.queue.popleft() for _ in range(n)]
        for g in groups:
            self.holder[g] = member.name
        member.outstanding.update(groups)
        reply = WorkAssign(
            reply_to=msg.id, epoch=self.epoch, version=self.epoch, prompts=[self.prompts[g] for g in groups]
        )
        self.reply(inbound, reply)
        self.log("assign", worker=member.name, groups=groups, msg_id=reply.id, request_id=msg.id)

    def _no_work_reason(self, held_version: int) -> str:
        if self.state == "done":
            return "done"
        if self.state != "running":
            return "no_epoch"
        if held_version != self.epoch:
            return "stale_version"
        return "" if self.queue else "queue_empty"

    def on_group_accepted(self, now: float, inbound: Inbound) -> None:
        msg = inbound.msg
        if msg.epoch != self.epoch or self.state != "running":
            self.log("late_accept_ignored", group_id=msg.group_id, msg_epoch=msg.epoch)
            return
        self.done.add(msg.group_id)
        holder = self.holder.pop(msg.group_id, None)
        # accepted from a worker we had given up on: keep it done. A held group is never queued, so
        # the O(B) deque scan is needed only when nobody held it (it was requeued, or a duplicate).
        if holder is None and msg.group_id in self.queue:
            self.queue.remove(msg.group_id)
        for name in {holder, msg.worker} - {None}:
            member = self.members.get(name)  # type: ignore[arg-type]
            if member is not None:
                member.outstanding.discard(msg.group_id)
        if len(self.done) == self.s.groups_per_epoch:
            self.state = "training"
            self.log("epoch_generated", groups=len(self.done))

    # --- epochs ------------------------------------------------------------------------------

    def on_weights_available(self, now: float, inbound: Inbound) -> None:
        self.available_version = max(self.available_version, inbound.msg.version)
        self.reply(inbound, Ack(reply_to=inbound.msg.id))
        self._maybe_open()

    def on_step_done(self, now: float, inbound: Inbound) -> None:
        msg = inbound.msg
        self.epochs_completed = max(self.epochs_completed, msg.epoch + 1)
        self.log("epoch_done", done_epoch=msg.epoch, new_version=msg.version, metrics=msg.metrics)
        self.reply(inbound, Ack(reply_to=msg.id))
        if msg.version >= self.s.epochs:
            self._shutdown("completed")
        else:
            self._maybe_open()

    def _maybe_open(self) -> None:
        """Open epoch e = v as soon as weights v exist and the previous epoch is fully generated."""
        v = self.available_version
        if v < 0 or v >= self.s.epochs or self.state not in ("waiting_weights", "training"):
            return
        if self.state == "training" and v != self.epoch + 1:
            return
        buffer = self._first("buffer")
        if buffer is None:
            self.state = "waiting_weights"
            self.log("epoch_open_deferred", reason="no buffer registered")
            return
        self.epoch = self.version = v
        self.prompts = {p.group_id: p for p in self.task.prompts_for_epoch(v, self.s.groups_per_epoch)}
        self.queue = deque(sorted(self.prompts))
        self.holder, self.done, self.waiting = {}, set(), set()
        for m in self.members.values():
            m.outstanding.clear()
        self.state = "opening"
        msg = self.emit(Dest.reply(buffer.identity), EpochOpen(epoch=v, version=v, groups=self.s.groups_per_epoch))
        self._open_id = msg.id
        self.expect(msg, self.s.request_timeout_s, "buffer ack of epoch_open", self._open_timed_out)

    def _open_timed_out(self, now: float) -> None:
        self.log("epoch_open_retry", reason="buffer did not ack epoch_open")
        self.state = "waiting_weights"
        self._maybe_open()

    def on_ack(self, now: float, inbound: Inbound) -> None:
        if self.state == "opening" and inbound.msg.reply_to == self._open_id:
            self.state = "running"
            self.log("epoch_open", groups=self.s.groups_per_epoch)
            start = EpochStart(epoch=self.epoch, version=self.epoch, groups=self.s.groups_per_epoch)
            for m in sorted(self.members.values(), key=lambda m: m.name):
                if m.role in ("worker", "trainer"):
                    self._to_member(m.name, start)

    def _shutdown(self, reason: str) -> None:
        self.state = "done"
        self.log("run_done", reason=reason, epochs_completed=self.epochs_completed)
        for m in sorted(self.members.values(), key=lambda m: m.name):
            self._to_member(m.name, Shutdown(reason=reason, epoch=self.epoch, version=self.epoch))
        self.stopped = True

    # --- introspection and control -----------------------------------------------------------

    def on_status_request(self, now: float, inbound: Inbound) -> None:
        members = [
            MemberInfo(
                name=m.name,
                role=m.role,
                version=m.version,
                outstanding=len(m.outstanding),
                last_seen_s=round(now - m.last_seen, 3),
            )
            for m in sorted(self.members.values(), key=lambda m: m.name)
        ]
        status = Status(
            reply_to=inbound.msg.id,
            epoch=self.epoch,
            version=self.epoch,
            state=self.state,
            mode=self.s.mode,
            groups_per_epoch=self.s.groups_per_epoch,
            groups_done=len(self.done),
            groups_outstanding=len(self.holder),
            epochs_total=self.s.epochs,
            members=members,
            desired_workers=self.s.desired_workers,
            publisher_addr=self.s.publisher_addr,
            buffer_addr=self.s.buffer_addr,
            waiting_for=self.stall_reason,
        )
        self.reply(inbound, status)

    def on_scale(self, now: float, inbound: Inbound) -> None:
        self.s.desired_workers = inbound.msg.workers
        self.log("scale", workers=inbound.msg.workers)
        self.reply(inbound, Ack(reply_to=inbound.msg.id))

    def on_request_stop(self, now: float, inbound: Inbound) -> None:
        self.reply(inbound, Ack(reply_to=inbound.msg.id))
        self._shutdown(f"stop requested: {inbound.msg.reason}" if inbound.msg.reason else "stop requested")

    # --- helpers -----------------------------------------------------------------------------

    def _first(self, role: str) -> Member | None:
        return next((m for m in sorted(self.members.values(), key=lambda m: m.name) if m.role == role), None)

    def _to_member(self, name: str, msg: Msg) -> None:
        """Send a copy of `msg` (with its own id) to a member."""
        self.emit(Dest.reply(self.members[name].identity), msgspec.structs.replace(msg, id=new_id()))
