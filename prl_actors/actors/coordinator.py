"""Coordinator: turns messages into decisions of three plain parts it owns.

- `Membership` (membership.py): who is in the run, liveness;
- `EpochWork` (epoch_work.py): the open epoch's groups, queued / held / done (exactly-once rules);
- `PhaseMachine` (phase.py): the epoch state machine.
Invariants it keeps:
- epoch e is bound to weights v_e (protocol/versions.py); a worker is given epoch-e work only when its
  WorkRequest says it holds v_e (on-policy);
- every group of the epoch is queued, held by exactly one live worker, or done (accepted by the
  buffer); a leaving or silent worker's held groups go back to the queue; a done group is never handed
  out again.
Every input (a message its sender may send, or an effective tick) is logged as `coord_input` with the
message in full, so `prl-actors replay` can feed a run's inputs back into this class and compare its
decisions.
Trust (docs/SECURITY.md): who may send what is checked before any handler runs (runtime.Core); on
top of that `scale` is bounded by `max_workers`, and every assigned group carries a ticket
(tickets.py) without which the buffer refuses the group.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from prl_actors.actors import tickets
from prl_actors.actors.dynamic_sampling import Rounds, epoch_stride
from prl_actors.actors.epoch_work import Accept, EpochWork
from prl_actors.actors.membership import Member, Membership
from prl_actors.actors.phase import PhaseMachine
from prl_actors.actors.runtime import REFUSALS, Core, handles
from prl_actors.logs import EventLog
from prl_actors.protocol.messages import (
    Ack,
    EpochClose,
    EpochOpen,
    EpochStart,
    ErrorCode,
    GroupAccepted,
    Heartbeat,
    HeartbeatAck,
    Leave,
    MemberInfo,
    Msg,
    NoWork,
    NoWorkReason,
    Phase,
    Prompt,
    Register,
    RequestStop,
    Role,
    Scale,
    Shutdown,
    Status,
    StatusRequest,
    StepDone,
    WeightsAvailable,
    Welcome,
    WorkAssign,
    WorkRequest,
    new_id,
)
from prl_actors.protocol.versions import epoch_for, on_policy, version_for
from prl_actors.tasks.base import Task
from prl_actors.transport.port import Dest, Inbound

STALL_LOG_S = 10.0  # how often a stalled coordinator says why it waits
# The first weights wait on the trainer loading (or building) the model: normal for a while, not a stall.
FIRST_WEIGHTS_GRACE_S = 60.0


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
    max_workers: int = 64  # `scale` above this is refused (over_limit)
    dynamic_sampling: bool = False  # actors/dynamic_sampling.py
    max_sampling_rounds: int = 1


class CoordinatorCore(Core):
    role = Role.COORDINATOR
    joins = False  # the membership server: no membership client part

    def __init__(self, name: str, log: EventLog, settings: CoordinatorSettings, task: Task) -> None:
        super().__init__(name, log)
        self.s, self.task = settings, task
        self.members = Membership()
        self.phase = PhaseMachine()
        self.work = EpochWork.empty()
        self.prompts: dict[int, Prompt] = {}
        self.rounds: Rounds | None = None  # dynamic sampling: the open epoch's rounds
        self.available_version = -1
        self.epochs_completed = 0
        self.done_reason = ""
        self._progress: tuple[Phase, int, int] = (Phase.DONE, -1, -1)
        self._progress_at = 0.0
        self.stall_reason = ""
        self._open_id = ""  # the EpochOpen whose Ack opens the epoch
        self.ticket_key = tickets.new_key()  # shared with the buffer through EpochOpen
        self.log("coord_settings", epochs=settings.epochs, desired_workers=settings.desired_workers)  # for replay
        if task.note:
            self.log("prompts_left_out", note=task.note)

    # --- inputs ------------------------------------------------------------------------------

    def admitted(self, now: float, inbound: Inbound[Msg]) -> None:
        """An input its sender may send (refused ones change nothing, so replay needs none of them)."""
        self.log(
            "coord_input",
            now=now,
            identity=inbound.identity.hex(),
            principal=inbound.principal,  # "" when the transport authenticates nothing (see Inbound.who)
            msg=msgspec.to_builtins(inbound.msg),
        )
        if not isinstance(inbound.msg, Register):  # a Register under a held name must not keep it alive
            self.members.seen(inbound.msg.sender, now)

    def tick(self, now: float) -> None:
        silent = self.members.silent(now, self.s.heartbeat_timeout_s)
        if silent or self.requests.any_due(now):  # a tick that decides something
            self.log("coord_input", now=now, tick=True)  # logged before its effects, which replay compares
        super().tick(now)
        for m in silent:
            self._remove(m, "heartbeat_timeout")
        self._watch_stall(now)

    def _watch_stall(self, now: float) -> None:
        """No silent hang: in every state but done, while the run makes no progress, say every
        STALL_LOG_S why we wait."""
        progress = (self.phase.current, self.epoch, len(self.work.done))
        if progress != self._progress:
            self._progress, self._progress_at, self.stall_reason = progress, now, ""
            return
        if self.phase.is_(Phase.DONE) or now - self._progress_at < self._stall_after():
            return
        self._progress_at = now
        reason = self._stall_reason()
        self.log(
            "stalled", reason=reason, state=self.phase.current, queued=len(self.work.queue), held=len(self.work.holder)
        )
        self.stall_reason = reason

    def _stall_after(self) -> float:
        """Seconds without progress before a stall is reported: longer for the first weights (the
        trainer starts, imports torch and loads the model), so a normal start prints no `stalled:`."""
        first = self.phase.is_(Phase.WAITING_WEIGHTS) and self.available_version < 0
        return FIRST_WEIGHTS_GRACE_S if first else STALL_LOG_S

    def _stall_reason(self) -> str:
        if self.phase.is_(Phase.TRAINING):
            return (
                f"waiting for the trainer's step of epoch {self.epoch} "
                f"(weights v{version_for(self.epoch + 1)}: publisher weights_available)"
            )
        if self.phase.is_(Phase.WAITING_WEIGHTS):
            if not self.members.of_role(Role.TRAINER):
                return "waiting for the trainer's weights: no trainer has registered"
            return "waiting for the trainer's weights (publisher: weights_available)"
        if self.phase.is_(Phase.OPENING):
            return "waiting for the buffer to ack epoch_open"
        workers = self.members.of_role(Role.WORKER)
        if not workers:
            return "no worker is registered"
        behind = [m.name for m in workers if not on_policy(self.epoch, m.version)]
        if len(behind) == len(workers):
            return f"every worker still holds an older version ({', '.join(sorted(behind)[:4])})"
        return f"{len(self.work.holder)} groups held by workers, {len(self.work.queue)} queued"

    # --- membership --------------------------------------------------------------------------

    @handles(Register)
    def on_register(self, now: float, inbound: Inbound[Register]) -> None:
        msg = inbound.msg
        if self._refused_join(now, inbound):
            return
        old = self.members.get(msg.sender)
        if old is not None:  # the same process again, or a dead one's successor: its old work is lost
            self._remove(old, "re_registered")
        self.members.join(msg.sender, msg.role, inbound.identity, now, pid=msg.pid, host=msg.host, key=inbound.who)
        self.log("member_join", member=msg.sender, member_role=msg.role, pid=msg.pid, host=msg.host)
        if msg.role == Role.BUFFER and self.phase.is_(Phase.WAITING_WEIGHTS):
            self._maybe_open()
        epoch = self._open_epoch()
        welcome = Welcome(
            reply_to=msg.id,
            epoch=epoch,
            version=version_for(epoch) if epoch >= 0 else -1,
            run_id=self.s.run_id,
            mode=self.s.mode,
            group_size=self.s.group_size,
            groups_per_epoch=self.s.groups_per_epoch,
            heartbeat_interval_s=self.s.heartbeat_interval_s,
            publisher_addr=self.s.publisher_addr,
            buffer_addr=self.s.buffer_addr,
        )
        self.reply(inbound, welcome)

    def _refused_join(self, now: float, inbound: Inbound[Register]) -> bool:
        """One member per name: a name held by another live process is refused, not taken over (a
        second `prl-actors up` or a misnamed joiner must not steal a member's place). A run that is
        over tells a late joiner so."""
        msg = inbound.msg
        if self.phase.is_(Phase.DONE):
            self.reply(inbound, Shutdown(reason=f"the run is over ({self.done_reason})"))
            return True
        old = self.members.get(msg.sender)
        live = old is not None and now - old.last_seen <= self.s.heartbeat_timeout_s
        if old is not None and live and old.key != inbound.who:  # pid and host are the sender's word: the key is not
            self.refuse(
                inbound,
                f"name {msg.sender!r} is held by a live member registered with another key",
                ErrorCode.FORBIDDEN,
            )
            return True
        if old is None or not live or (old.pid, old.host) == (msg.pid, msg.host):
            return False
        self.refuse(inbound, f"name {msg.sender!r} is held by a live member (pid {old.pid} on {old.host})")
        return True

    @handles(Heartbeat)
    def on_heartbeat(self, now: float, inbound: Inbound[Heartbeat]) -> None:
        member = self.members.get(inbound.msg.sender)
        if member is not None:
            member.version, member.refused = inbound.msg.version, inbound.msg.refused
        epoch = self._open_epoch()
        version = version_for(epoch) if epoch >= 0 else -1
        self.reply(
            inbound, HeartbeatAck(reply_to=inbound.msg.id, known=member is not None, epoch=epoch, version=version)
        )

    @handles(Leave)
    def on_leave(self, now: float, inbound: Inbound[Leave]) -> None:
        """Only the key a member registered with may make it leave: a role key (`worker`) that may
        speak as every worker-... name must not evict the others."""
        member = self.members.get(inbound.msg.sender)
        if member is not None and member.key != inbound.who:
            self.refuse(
                inbound,
                f"{member.name!r} registered with another key; only that key may make it leave",
                ErrorCode.FORBIDDEN,
            )
            return
        if member is not None:
            self._remove(member, f"leave:{inbound.msg.reason}" if inbound.msg.reason else "leave")
        self.reply(inbound, Ack(reply_to=inbound.msg.id))

    def _remove(self, member: Member, reason: str) -> None:
        self.members.remove(member.name)
        self.log("member_leave", member=member.name, member_role=member.role, reason=reason)
        lost = self.work.release(member.name)
        if lost:
            self.log("requeue", worker=member.name, groups=lost, reason=reason)
            for name in self.work.take_waiting():
                self._to_member(name, self._epoch_start())

    # --- work --------------------------------------------------------------------------------

    @handles(WorkRequest)
    def on_work_request(self, now: float, inbound: Inbound[WorkRequest]) -> None:
        msg = inbound.msg
        member = self.members.get(msg.sender)
        if member is None or member.role != Role.WORKER:
            self.refuse(inbound, "register as a worker first")
            return
        member.version = msg.version
        reason = self._no_work_reason(msg.version)
        if reason is not None:
            self._no_work(inbound, member.name, reason)
            return
        share = self.work.fair_share(member.name, len(self.members.of_role(Role.WORKER)))
        if share == 0:
            self._no_work(inbound, member.name, NoWorkReason.FAIR_SHARE)
            return
        groups = self.work.assign(member.name, min(msg.max_groups, self.s.max_groups_per_request, share))
        prompts = [self._ticketed(self.prompts[g], member.name) for g in groups]
        reply = WorkAssign(reply_to=msg.id, epoch=self.epoch, version=version_for(self.epoch), prompts=prompts)
        self.reply(inbound, reply)
        self.log("assign", worker=member.name, groups=groups, msg_id=reply.id, request_id=msg.id)

    def _ticketed(self, prompt: Prompt, worker: str) -> Prompt:
        ticket = tickets.mint(self.ticket_key, self.epoch, prompt.group_id, worker)
        return msgspec.structs.replace(prompt, ticket=ticket)

    def _no_work(self, inbound: Inbound[WorkRequest], worker: str, reason: NoWorkReason) -> None:
        version = version_for(self.epoch)
        self.reply(inbound, NoWork(reply_to=inbound.msg.id, reason=reason, epoch=self.epoch, version=version))
        self.log("no_work", worker=worker, reason=reason, request_id=inbound.msg.id)
        if reason == NoWorkReason.QUEUE_EMPTY:
            self.work.waiting.add(worker)

    def _no_work_reason(self, held_version: int) -> NoWorkReason | None:
        if self.phase.is_(Phase.DONE):
            return NoWorkReason.DONE
        if not self.phase.is_(Phase.RUNNING):
            return NoWorkReason.NO_EPOCH
        if not on_policy(self.epoch, held_version):
            return NoWorkReason.STALE_VERSION
        return None if self.work.queue else NoWorkReason.QUEUE_EMPTY

    @handles(GroupAccepted)
    def on_group_accepted(self, now: float, inbound: Inbound[GroupAccepted]) -> None:
        msg = inbound.msg
        if msg.epoch != self.epoch or not self.phase.is_(Phase.RUNNING):
            self.log("late_accept_ignored", group_id=msg.group_id, msg_epoch=msg.epoch)
            return
        if self.work.accept(msg.group_id)[0] is not Accept.NEW:
            return
        if self.rounds is not None and self._another_round(msg):
            return
        if self.work.complete:
            self.phase.to(Phase.TRAINING)
            self.log("epoch_generated", groups=len(self.work.done))
            if self.rounds is not None:
                self._close_sampling()
            self._maybe_open()  # the step's weights may have come first (the buffer's accept raced them)

    # --- epochs ------------------------------------------------------------------------------

    @handles(WeightsAvailable)
    def on_weights_available(self, now: float, inbound: Inbound[WeightsAvailable]) -> None:
        self.available_version = max(self.available_version, inbound.msg.version)
        self.reply(inbound, Ack(reply_to=inbound.msg.id))
        self._maybe_open()

    @handles(StepDone)
    def on_step_done(self, now: float, inbound: Inbound[StepDone]) -> None:
        msg = inbound.msg
        self.epochs_completed = max(self.epochs_completed, msg.epoch + 1)
        self.log("epoch_done", done_epoch=msg.epoch, new_version=msg.version, metrics=msg.metrics)
        self.reply(inbound, Ack(reply_to=msg.id))
        if epoch_for(msg.version) >= self.s.epochs:
            self._shutdown("completed")
        else:
            self._maybe_open()

    def _maybe_open(self) -> None:
        """Open the epoch of weights v as soon as they exist and the previous epoch is fully generated."""
        v = self.available_version
        e = epoch_for(v)
        if v >= 0 and e >= self.s.epochs and self.phase.is_(Phase.WAITING_WEIGHTS):
            self._shutdown("completed")  # resumed from the last epoch's checkpoint: nothing to do
            return
        if v < 0 or e >= self.s.epochs or not self.phase.is_(Phase.WAITING_WEIGHTS, Phase.TRAINING):
            return
        if self.phase.is_(Phase.TRAINING) and e != self.epoch + 1:
            return
        buffer = self.members.first(Role.BUFFER)
        if buffer is None:
            if self.phase.is_(Phase.TRAINING):
                self.phase.to(Phase.WAITING_WEIGHTS)
            self.log("epoch_open_deferred", reason="no buffer registered")
            return
        self.epoch, self.version = e, v
        self.prompts = {p.group_id: p for p in self._epoch_prompts(e, range(self.s.groups_per_epoch))}
        self.work = EpochWork(list(self.prompts))
        self.phase.to(Phase.OPENING)
        open_ = EpochOpen(
            epoch=e, version=v, groups=self.s.groups_per_epoch, ticket_key=self.ticket_key, id_bound=self._id_bound()
        )
        msg = self.emit(Dest.reply(buffer.identity), open_)
        self._open_id = msg.id
        self.expect(msg, self.s.request_timeout_s, "buffer ack of epoch_open", self._open_timed_out)

    def _open_timed_out(self, now: float) -> None:
        self.log("epoch_open_retry", reason="buffer did not ack epoch_open")
        self.phase.to(Phase.WAITING_WEIGHTS)
        self._maybe_open()

    @handles(Ack)
    def on_ack(self, now: float, inbound: Inbound[Ack]) -> None:
        if self.phase.is_(Phase.OPENING) and inbound.msg.reply_to == self._open_id:
            self.phase.to(Phase.RUNNING)
            self.log("epoch_open", groups=self.s.groups_per_epoch)
            for m in self.members.of_role(Role.WORKER, Role.TRAINER):
                self._to_member(m.name, self._epoch_start())

    def _shutdown(self, reason: str) -> None:
        self.done_reason = reason
        self.phase.to(Phase.DONE)
        self.log("run_done", reason=reason, epochs_completed=self.epochs_completed)
        for m in self.members.sorted():
            self._to_member(m.name, Shutdown(reason=reason, epoch=self.epoch, version=version_for(self.epoch)))
        self.stopped = True

    # --- dynamic sampling (actors/dynamic_sampling.py) ----------------------------------------

    def _id_bound(self) -> int:
        """Group ids an epoch may use with dynamic sampling (0 = off); sets up the epoch's rounds."""
        if not self.s.dynamic_sampling:
            self.rounds = None
            return 0
        self.rounds = Rounds(self.s.groups_per_epoch, self.s.max_sampling_rounds)
        return self._stride()

    def _stride(self) -> int:
        return epoch_stride(self.s.groups_per_epoch, self.s.dynamic_sampling, self.s.max_sampling_rounds)

    def _epoch_prompts(self, epoch: int, ids: range | list[int]) -> list[Prompt]:
        """The prompts of group ids `ids` of `epoch`: stream position epoch * stride + id."""
        if not self.s.dynamic_sampling:
            return self.task.prompts_for_epoch(epoch, self.s.groups_per_epoch)
        return self.task.prompts_at(epoch * self._stride(), list(ids))

    def _another_round(self, msg: GroupAccepted) -> bool:
        """Record an accepted group; when it completes a round short of B informative groups (and
        rounds are left), hand out the next round and say so. True when a round was added."""
        assert self.rounds is not None
        self.rounds.accept(msg.group_id, msg.informative)
        if not self.work.complete:
            return False
        ids = self.rounds.next_round()
        if not ids:
            return False
        new = self._epoch_prompts(self.epoch, ids)
        self.prompts.update((p.group_id, p) for p in new)
        self.work.extend(ids)
        self.log("sampling_round", round=len(self.rounds.ends) - 1, groups=ids, kept=self.rounds.kept)
        for name in self.work.take_waiting():
            self._to_member(name, self._epoch_start())
        return True

    def _close_sampling(self) -> None:
        """No more rounds: tell the buffer to end the trainer's stream with the informative groups."""
        assert self.rounds is not None
        r = self.rounds
        self.log("sampling_done", kept=r.kept, generated=r.handed_out, rounds=len(r.ends), short=r.short)
        self._send_close(self.epoch, r)

    def _send_close(self, epoch: int, rounds: Rounds) -> None:
        """EpochClose to the buffer, again after each request timeout while `epoch` is the one training."""
        buffer = self.members.first(Role.BUFFER)
        if buffer is None or epoch != self.epoch or not self.phase.is_(Phase.TRAINING):
            return
        close = EpochClose(epoch=epoch, version=version_for(epoch), groups=rounds.kept, generated=rounds.handed_out)
        msg = self.emit(Dest.reply(buffer.identity), close)
        retry = lambda now: self._send_close(epoch, rounds)  # noqa: E731
        self.expect(msg, self.s.request_timeout_s, "buffer ack of epoch_close", retry)

    # --- introspection and control -----------------------------------------------------------

    @handles(StatusRequest)
    def on_status_request(self, now: float, inbound: Inbound[StatusRequest]) -> None:
        members = [
            MemberInfo(
                name=m.name,
                role=m.role,
                version=m.version,
                outstanding=len(self.work.held_by(m.name)),
                last_seen_s=round(now - m.last_seen, 3),
                refused=m.refused,
            )
            for m in self.members.sorted()
        ]
        status = Status(
            reply_to=inbound.msg.id,
            epoch=self.epoch,
            version=version_for(self.epoch),
            state=self.phase.current,
            mode=self.s.mode,
            groups_per_epoch=self.s.groups_per_epoch,
            groups_done=len(self.work.done),
            groups_outstanding=len(self.work.holder),
            epochs_total=self.s.epochs,
            members=members,
            desired_workers=self.s.desired_workers,
            publisher_addr=self.s.publisher_addr,
            buffer_addr=self.s.buffer_addr,
            waiting_for=self.stall_reason,
            refused={k: v for k, v in sorted(self.counters.items()) if k.startswith(REFUSALS)},
        )
        self.reply(inbound, status)

    @handles(Scale)
    def on_scale(self, now: float, inbound: Inbound[Scale]) -> None:
        if not 0 <= inbound.msg.workers <= self.s.max_workers:
            detail = f"scale to {inbound.msg.workers} workers: allowed 0..{self.s.max_workers} (run.max_workers)"
            self.refuse(inbound, detail, ErrorCode.OVER_LIMIT)
            return
        self.s.desired_workers = inbound.msg.workers
        self.log("scale", workers=inbound.msg.workers)
        self.reply(inbound, Ack(reply_to=inbound.msg.id))

    @handles(RequestStop)
    def on_request_stop(self, now: float, inbound: Inbound[RequestStop]) -> None:
        self.reply(inbound, Ack(reply_to=inbound.msg.id))
        self._shutdown(f"stop requested: {inbound.msg.reason}" if inbound.msg.reason else "stop requested")

    # --- helpers -----------------------------------------------------------------------------

    def _open_epoch(self) -> int:
        """The epoch whose work is out (-1 when none is)."""
        return self.epoch if self.phase.epoch_open else -1

    def _epoch_start(self) -> EpochStart:
        return EpochStart(epoch=self.epoch, version=version_for(self.epoch), groups=self.s.groups_per_epoch)

    def _to_member(self, name: str, msg: Msg) -> None:
        """Send a copy of `msg` (with its own id) to a member."""
        member = self.members.get(name)
        if member is not None:
            self.emit(Dest.reply(member.identity), msgspec.structs.replace(msg, id=new_id()))
