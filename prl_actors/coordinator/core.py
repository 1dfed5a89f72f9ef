"""Coordinator: turns messages into decisions of three plain parts it owns.

- `Membership` (membership.py): who is in the run, liveness;
- `EpochWork` (epoch_work.py): the open epoch's groups, queued / held / done (exactly-once rules);
- `PhaseMachine` (phase.py): the epoch state machine.
Invariants it keeps:
- epoch e is bound to weights v_e (protocol/versions.py); a worker is given epoch-e work only when its
  WorkRequest says it holds v_e (on-policy), or, under run.mode bounded with k = max_staleness, any
  of v_{e-k} .. v_e (`within_bound`); then epoch e+1 opens as soon as epoch e is generated and
  v_{e+1-k} is published (`may_open`), before the trainer has made v_{e+1}; except an epoch whose
  weights are evaluated (`_bound`): it opens at v_e, is generated with v_e only, and the next epoch
  waits for that evaluation (the pipeline pauses there, docs/OBSERVE.md);
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

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import msgspec

from prl_actors.coordinator.epoch_work import Accept, EpochWork
from prl_actors.coordinator.evaluation import EvalPlan, EvalSink, summarize
from prl_actors.coordinator.membership import Member, Membership
from prl_actors.coordinator.phase import PhaseMachine
from prl_actors.protocol import contract, tickets
from prl_actors.protocol.messages import (
    Ack,
    EpochClose,
    EpochOpen,
    EpochStart,
    ErrorCode,
    EvalAssign,
    EvalGroup,
    EvalResult,
    GenerationContract,
    GiveBack,
    GroupAccepted,
    GroupDropped,
    GroupRefused,
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
    RejectReason,
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
from prl_actors.protocol.versions import epoch_for, floor_version, may_open, version_for, within_bound
from prl_actors.runtime.core import REFUSALS, Core, handles
from prl_actors.runtime.faults import armed, kill_point
from prl_actors.training.dynamic_sampling import Rounds, epoch_stride
from prl_actors.transport.port import Dest, Inbound
from prl_actors.weights.pulls import to_wire

if TYPE_CHECKING:
    from prl_actors.records.logs import EventLog
    from prl_actors.tasks.base import Task

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
    dynamic_sampling: bool = False  # training/dynamic_sampling.py
    max_sampling_rounds: int = 1
    max_staleness: int = 0  # run.mode bounded: k (protocol/versions.py); 0 = strict on-policy
    hold_factor: float = 10.0  # an assignment's deadline: hold_factor x p95 of observed group times ...
    hold_min_s: float = 30.0  # ... and at least this
    max_group_failures: int = 3  # a group given back this often is given up (on_error)
    on_error: str = "fail_first"  # fail | skip | fail_first (config.TaskSection.on_error)
    expelled_wait_s: float = 60.0  # every worker expelled: how long one may still join (transport.join_timeout_s)
    contract: GenerationContract | None = None  # the run's (protocol/contract.py); None: workers are not checked


NOTICES_KEPT = 20
News = TypeVar("News", EpochStart, HeartbeatAck)  # the messages that carry bounded mode's weights news
GROUP_TIMES_KEPT = 256


class CoordinatorCore(Core):
    role = Role.COORDINATOR
    joins = False  # the membership server: no membership client part

    def __init__(
        self,
        name: str,
        log: EventLog,
        settings: CoordinatorSettings,
        task: Task,
        eval_plan: EvalPlan | None = None,
        eval_sink: EvalSink | None = None,
    ) -> None:
        super().__init__(name, log)
        self.s, self.task = settings, task
        self.members = Membership()
        self.phase = PhaseMachine()
        self.work = EpochWork.empty()
        self.prompts: dict[int, Prompt] = {}
        self.rounds: Rounds | None = None  # dynamic sampling: the open epoch's rounds
        self.available_version = -1
        self.step_kls: dict[int, float] = {}  # bounded mode: version i -> the trainer's KL(v_i || v_{i+1})
        self.epochs_completed = 0
        self.done_reason = ""
        self._progress: tuple[Phase, int, int, int] = (Phase.DONE, -1, -1, -1)
        self._progress_at = 0.0
        self.stall_reason = ""
        self._open_id = ""  # the EpochOpen whose Ack opens the epoch
        self.ticket_key = tickets.new_key()  # shared with the buffer through EpochOpen
        self.assigned_at: dict[int, float] = {}  # group id -> when it was handed out (its deadline's start)
        self.group_times: deque[float] = deque(maxlen=GROUP_TIMES_KEPT)  # assign -> accept, seconds
        self.failures: dict[int, list[str]] = {}  # group id -> why it failed, this epoch
        self.expelled: set[str] = set()  # member names refused for the rest of the run
        self.expelled_at, self.expelled_why = 0.0, ""  # the last expulsion: when, and why
        self.expelled_keys: set[str] = set()  # and their keys, where the key is the member's own
        self.keys_of: dict[str, str] = {}  # member name -> the key it registered with ("" unauthenticated)
        self.notices: deque[str] = deque(maxlen=NOTICES_KEPT)
        self.notices_total = 0
        # evaluation (prl_actors/coordinator/evaluation.py): one evaluation at a time, of weights eval_version
        self.eval_plan, self.eval_sink = eval_plan, eval_sink
        self.eval_epoch = -1  # the epoch whose weights are being evaluated (-1: none)
        self.eval_work = EpochWork.empty()
        self.eval_results: dict[int, EvalGroup] = {}
        self.eval_started = 0.0
        self.eval_last: dict[str, float] = {}
        self.final_eval = False  # the last step is done; the run ends when this evaluation does
        self.final_epoch = -1  # set once the last step is done: the epoch of the final weights
        self.strict_epoch = -1  # bounded mode: the last epoch opened at k = 0 for its evaluation (`_bound`)
        eval_done = sorted(eval_plan.done) if eval_plan is not None else []
        run_contract = msgspec.to_builtins(settings.contract) if settings.contract is not None else None
        self.log(  # for replay (the epochs already evaluated decide what is evaluated; the contract who joins)
            "coord_settings",
            epochs=settings.epochs,
            desired_workers=settings.desired_workers,
            eval_done=eval_done,
            contract=run_contract,
        )
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
        overdue = self.work.overdue(now, self.assigned_at, self.hold_deadline_s()) if self.phase.epoch_open else {}
        orphaned = self._orphaned(now)
        if silent or overdue or self.requests.any_due(now) or orphaned:  # it decides something
            self.log("coord_input", now=now, tick=True)  # logged before its effects, which replay compares
        super().tick(now)
        for m in silent:
            self._remove(m, "heartbeat_timeout")
        for worker, groups in overdue.items():
            self._hold_expired(worker, groups)
        if orphaned:
            self._shutdown(orphaned)
            return
        self._watch_stall(now)

    def _orphaned(self, now: float) -> str:
        """Why the run ends now ('' when it does not): workers were expelled and none is left, the open
        epoch (or an evaluation) waits for groups, and no worker joined within expelled_wait_s of the
        last expulsion. Expelled names cannot come back (`up` does not replace them), so without this
        a run whose every worker was expelled waited for good."""
        if not self.expelled or self.members.of_role(Role.WORKER) or now - self.expelled_at < self.s.expelled_wait_s:
            return ""
        if not (self.phase.is_(Phase.RUNNING) or self._eval_blocks()):
            return ""
        names = ", ".join(sorted(self.expelled)[:4]) + ("..." if len(self.expelled) > 4 else "")
        return (
            f"failed: no worker is left to generate the run's groups: {names} expelled (last: {self.expelled_why}), "
            f"and none joined within {self.s.expelled_wait_s:g}s"
        )

    def _watch_stall(self, now: float) -> None:
        """No silent hang: in every state but done, while the run makes no progress, say every
        STALL_LOG_S why we wait."""
        progress = (self.phase.current, self.epoch, len(self.work.done), len(self.eval_work.done))
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
        if self._eval_blocks():
            return (
                f"waiting for the evaluation of v{version_for(self.eval_epoch)}: {len(self.eval_work.holder)} "
                f"eval prompts held by workers, {len(self.eval_work.queue)} queued"
            )
        if self.phase.is_(Phase.TRAINING):
            want = self._floor(self.epoch + 1)
            return f"waiting for the trainer's step of epoch {want - 1} (weights v{want}: publisher weights_available)"
        if self.phase.is_(Phase.WAITING_WEIGHTS):
            if not self.members.of_role(Role.TRAINER):
                return "waiting for the trainer's weights: no trainer has registered"
            return "waiting for the trainer's weights (publisher: weights_available)"
        if self.phase.is_(Phase.OPENING):
            return "waiting for the buffer to ack epoch_open"
        workers = self.members.of_role(Role.WORKER)
        if not workers:
            return "no worker is registered"
        behind = [m.name for m in workers if not within_bound(self.epoch, m.version, self._bound(self.epoch))]
        if len(behind) == len(workers):
            return f"every worker still holds an older version ({', '.join(sorted(behind)[:4])})"
        return f"{len(self.work.holder)} groups held by workers{self._holders()}, {len(self.work.queue)} queued"

    def _holders(self) -> str:
        """(worker-0: 3, worker-1: 2): who holds the open epoch's groups, the most first (4 named)."""
        counts: dict[str, int] = {}
        for w in self.work.holder.values():
            counts[w] = counts.get(w, 0) + 1
        if not counts:
            return ""
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        named = ", ".join(f"{w}: {n}" for w, n in top[:4]) + (", ..." if len(top) > 4 else "")
        return f" ({named}; deadline {self.hold_deadline_s():.0f}s)"

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
        self.keys_of[msg.sender] = inbound.principal
        self.log("member_join", member=msg.sender, member_role=msg.role, pid=msg.pid, host=msg.host)
        if msg.role == Role.BUFFER and self.phase.is_(Phase.WAITING_WEIGHTS):
            self._maybe_open()
        if msg.role == Role.WORKER and self.final_eval:  # a worker joining during the final evaluation
            self._to_member(msg.sender, self._eval_start())
        epoch = self._open_epoch()
        welcome = Welcome(
            reply_to=msg.id,
            epoch=epoch,
            version=self._floor(epoch) if epoch >= 0 else -1,
            run_id=self.s.run_id,
            mode=self.s.mode,
            group_size=self.s.group_size,
            groups_per_epoch=self.s.groups_per_epoch,
            heartbeat_interval_s=self.s.heartbeat_interval_s,
            publisher_addr=self.s.publisher_addr,
            buffer_addr=self.s.buffer_addr,
            contract=self.s.contract,
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
        if msg.sender in self.expelled:
            self.refuse(inbound, f"{msg.sender!r} was expelled from this run (run.max_bad_groups)")
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
            return self._refused_contract(inbound)
        self.refuse(inbound, f"name {msg.sender!r} is held by a live member (pid {old.pid} on {old.host})")
        return True

    def _refused_contract(self, inbound: Inbound[Register]) -> bool:
        """One generation contract (protocol/contract.py): a worker whose sampling settings, group size,
        token limits, model or task differ from the run's would generate off-policy (or with another
        model or data): it is refused, with the first differing setting, never adapted."""
        msg = inbound.msg
        if msg.role != Role.WORKER or self.s.contract is None:
            return False
        why = contract.refusal(msg.sender, msg.contract, self.s.contract)
        if why is None:
            return False
        self.notice(f"refused {msg.sender}: {why}")
        self.refuse(inbound, why)
        return True

    @handles(Heartbeat)
    def on_heartbeat(self, now: float, inbound: Inbound[Heartbeat]) -> None:
        member = self.members.get(inbound.msg.sender)
        if member is not None:
            member.version, member.refused = inbound.msg.version, inbound.msg.refused
        epoch = self._open_epoch()
        version = self._floor(epoch) if epoch >= 0 else -1
        ack = HeartbeatAck(reply_to=inbound.msg.id, known=member is not None, epoch=epoch, version=version)
        self.reply(inbound, self._with_news(ack))

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
        self._release_eval(member.name, reason)

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
            if reason != NoWorkReason.DONE and self._assign_eval(inbound, member):
                return
            self._no_work(inbound, member.name, reason)
            return
        share = self.work.fair_share(member.name, len(self.members.of_role(Role.WORKER)))
        if share == 0:
            self._no_work(inbound, member.name, NoWorkReason.FAIR_SHARE)
            return
        groups = self.work.assign(member.name, min(msg.max_groups, self.s.max_groups_per_request, share))
        self.assigned_at.update((g, now) for g in groups)
        prompts = [self._ticketed(self.prompts[g], member.name) for g in groups]
        reply = WorkAssign(reply_to=msg.id, epoch=self.epoch, version=msg.version, prompts=prompts)
        self.reply(inbound, reply)
        self.log("assign", worker=member.name, groups=groups, msg_id=reply.id, request_id=msg.id)

    def _ticketed(self, prompt: Prompt, worker: str) -> Prompt:
        ticket = tickets.mint(self.ticket_key, self.epoch, prompt.group_id, worker)
        return msgspec.structs.replace(prompt, ticket=ticket)

    def _no_work(self, inbound: Inbound[WorkRequest], worker: str, reason: NoWorkReason) -> None:
        version = self._floor(self.epoch)
        self.reply(inbound, NoWork(reply_to=inbound.msg.id, reason=reason, epoch=self.epoch, version=version))
        self.log("no_work", worker=worker, reason=reason, request_id=inbound.msg.id)
        if reason == NoWorkReason.QUEUE_EMPTY:
            self.work.waiting.add(worker)

    def _no_work_reason(self, held_version: int) -> NoWorkReason | None:
        if self.phase.is_(Phase.DONE):
            return NoWorkReason.DONE
        if not self.phase.is_(Phase.RUNNING):
            return NoWorkReason.NO_EPOCH
        if not within_bound(self.epoch, held_version, self._bound(self.epoch)):
            return NoWorkReason.STALE_VERSION
        return None if self.work.queue else NoWorkReason.QUEUE_EMPTY

    @handles(GroupAccepted)
    def on_group_accepted(self, now: float, inbound: Inbound[GroupAccepted]) -> None:
        msg = inbound.msg
        if msg.epoch != self.epoch or not self.phase.is_(Phase.RUNNING):
            self.log("late_accept_ignored", group_id=msg.group_id, msg_epoch=msg.epoch)
            return
        started = self.assigned_at.pop(msg.group_id, None)
        if started is not None:
            self.group_times.append(now - started)
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
        kill_point(self.name, "before_step_done", msg.epoch)
        if armed():  # tests only: a later inbox item, once this input's replies are sent
            self.defer(lambda now: kill_point(self.name, "after_step_done", msg.epoch))
        self.epochs_completed = max(self.epochs_completed, msg.epoch + 1)
        if self.s.max_staleness and "step_kl" in msg.metrics:  # bounded mode: the step's drift (weights/pulls.py)
            self.step_kls[msg.version - 1] = float(msg.metrics["step_kl"])
        self.log("epoch_done", done_epoch=msg.epoch, new_version=msg.version, metrics=msg.metrics)
        self.reply(inbound, Ack(reply_to=msg.id))
        if epoch_for(msg.version) >= self.s.epochs:
            self._finish_run(epoch_for(msg.version))
        else:
            self._maybe_open()

    def _maybe_open(self) -> None:
        """Open the epoch of weights v as soon as they exist and the previous epoch is fully generated."""
        if self.s.max_staleness:
            self._maybe_open_bounded()
            return
        v = self.available_version
        e = epoch_for(v)
        if v >= 0 and e >= self.s.epochs and self.phase.is_(Phase.WAITING_WEIGHTS):
            self._finish_run(e)  # resumed from the last epoch's checkpoint: nothing to train
            return
        if v < 0 or e >= self.s.epochs or not self.phase.is_(Phase.WAITING_WEIGHTS, Phase.TRAINING):
            return
        if self.phase.is_(Phase.TRAINING) and e != self.epoch + 1:
            return
        if self._eval_blocks() and self.eval_epoch < e:  # the workers must keep v_e until it is evaluated
            self.log("epoch_open_deferred", reason=f"evaluation of v{version_for(self.eval_epoch)} running")
            return
        self._open(e, v)

    def _maybe_open_bounded(self) -> None:
        """run.mode bounded (k >= 1): once epoch e is generated, open e+1 as soon as v_{e+1-k} exists
        (`may_open`), whether or not the trainer has made v_{e+1}. Waiting for weights (start, resume,
        a retried open) it opens the published version's epoch, or the epoch it was opening."""
        v = self.available_version
        if v < 0:
            return
        if self.phase.is_(Phase.WAITING_WEIGHTS) and epoch_for(v) >= self.s.epochs:
            self._finish_run(epoch_for(v))  # resumed from the last epoch's checkpoint: nothing to train
            return
        if self.phase.is_(Phase.TRAINING):
            e = self.epoch + 1
        elif self.phase.is_(Phase.WAITING_WEIGHTS):
            e = max(epoch_for(v), self.epoch)
        else:
            return
        if e >= self.s.epochs or not may_open(e, v, self._bound(e)):
            return  # the last epoch is generated (StepDone ends the run), or its floor weights are not out
        if self._eval_blocks() and self.eval_epoch < e:  # the workers must keep v_e until it is evaluated
            self.log("epoch_open_deferred", reason=f"evaluation of v{version_for(self.eval_epoch)} running")
            return
        self._open(e, version_for(e))

    def _open(self, e: int, v: int) -> None:
        """Open epoch e (bound to v) at the buffer: EpochOpen, whose Ack sets the epoch running."""
        buffer = self.members.first(Role.BUFFER)
        if buffer is None:
            if self.phase.is_(Phase.TRAINING):
                self.phase.to(Phase.WAITING_WEIGHTS)
            self.log("epoch_open_deferred", reason="no buffer registered")
            return
        self.epoch, self.version = e, v
        self.prompts = {p.group_id: p for p in self._epoch_prompts(e, range(self.s.groups_per_epoch))}
        self.work = EpochWork(list(self.prompts))
        self.assigned_at, self.failures = {}, {}
        if self.s.max_staleness and self._bound(e) == 0:  # its evaluation pauses the pipeline here
            self.strict_epoch = e
        self._start_eval(e, final=False)
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

    # --- dynamic sampling (training/dynamic_sampling.py) ----------------------------------------

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
            notices=list(self.notices),
            notices_total=self.notices_total,
            eval=self.eval_last,
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

    # --- failures: given back, refused, overdue (issue 23) -------------------------------------

    def forbidden(self, inbound: Inbound[Msg]) -> str:
        """An expelled member's name, or its own key, is refused whatever it sends."""
        if inbound.msg.sender in self.expelled or (inbound.principal and inbound.principal in self.expelled_keys):
            return f"{inbound.msg.sender!r} was expelled from this run (run.max_bad_groups)"
        return super().forbidden(inbound)

    def hold_deadline_s(self) -> float:
        """How long a worker may hold a group: hold_factor x the p95 of the run's observed group times
        (assign -> accepted), at least hold_min_s; before any group was timed, hold_factor x hold_min_s
        (a first group on a slow machine is not a hang)."""
        if not self.group_times:
            return self.s.hold_factor * self.s.hold_min_s
        times = sorted(self.group_times)
        p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
        return max(self.s.hold_min_s, self.s.hold_factor * p95)

    def notice(self, line: str) -> None:
        """A line for the operator's console (`up` prints new notices from Status)."""
        self.notices.append(line)
        self.notices_total += 1

    @handles(GiveBack)
    def on_give_back(self, now: float, inbound: Inbound[GiveBack]) -> None:
        msg = inbound.msg
        self.reply(inbound, Ack(reply_to=msg.id))
        mine = [g for g in msg.groups if self.work.holder.get(g) == msg.sender]
        if msg.epoch != self.epoch or not mine:
            return
        self.log("given_back", worker=msg.sender, groups=mine, error=msg.error)
        self._requeue_failed(mine, f"{msg.sender}: {msg.error}")

    def _hold_expired(self, worker: str, groups: list[int]) -> None:
        """Take the groups back from a live worker (a hung plugin or engine): requeued for anyone, not
        counted as failures (a slow worker is not a broken prompt); if the holder delivers after all,
        the buffer still accepts its group once (exactly-once holds: the first one in wins)."""
        deadline = self.hold_deadline_s()
        self.log("hold_expired", worker=worker, groups=groups, deadline_s=round(deadline, 3))
        for g in groups:
            self.assigned_at.pop(g, None)
            self.work.give_back(g)
        self._nudge()

    def _requeue_failed(self, groups: list[int], why: str) -> None:
        """Requeue groups whose generation failed; one that failed max_group_failures times is given up."""
        for g in groups:
            self.assigned_at.pop(g, None)
            self.work.give_back(g)
            if self._group_failed(g, why):
                return
        self._nudge()

    def _group_failed(self, group_id: int, why: str) -> bool:
        """Count a failure of the (given back) group; the max_group_failures-th gives it up under
        on_error. True when that ended the run."""
        causes = self.failures.setdefault(group_id, [])
        causes.append(why)
        if len(causes) >= self.s.max_group_failures:
            self._give_up(group_id, causes)
        return self.phase.is_(Phase.DONE)

    def _give_up(self, group_id: int, causes: list[str]) -> None:
        prompt = self.prompts.get(group_id)
        text = repr(prompt.prompt[:60]) if prompt is not None else "?"
        line = f"group {group_id} of epoch {self.epoch} (prompt {text}) failed {len(causes)} times; last: {causes[-1]}"
        self.log("group_given_up", group_id=group_id, causes=causes, policy=self.s.on_error)
        self.notice(line)
        fail = self.s.on_error == "fail" or (self.s.on_error == "fail_first" and self.epochs_completed == 0)
        if fail:
            self._shutdown(f"failed: {line} (task.on_error: {self.s.on_error})")
            return
        self.work.drop(group_id)
        self.log("group_dropped", group_id=group_id, msg_epoch=self.epoch)
        self.notice(f"dropped group {group_id} from epoch {self.epoch} (task.on_error: skip)")
        buffer = self.members.first(Role.BUFFER)
        if buffer is not None:
            dropped = GroupDropped(epoch=self.epoch, version=self.version, group_id=group_id, reason=causes[-1])
            self.emit(Dest.reply(buffer.identity), dropped)
        if self.work.complete:
            self.phase.to(Phase.TRAINING)
            self.log("epoch_generated", groups=len(self.work.done))
            if self.rounds is not None:
                self._close_sampling()
            self._maybe_open()

    @handles(GroupRefused)
    def on_group_refused(self, now: float, inbound: Inbound[GroupRefused]) -> None:
        """The buffer refused a group for its content (or the trainer could not train it): requeue it
        for another worker; an expelled worker leaves the run and may not come back."""
        msg = inbound.msg
        if msg.epoch == self.epoch and self.phase.epoch_open and self.work.give_back(msg.group_id):
            self.assigned_at.pop(msg.group_id, None)
            if self.phase.is_(Phase.TRAINING):
                self.phase.to(Phase.RUNNING)
            self.log("group_refused", group_id=msg.group_id, worker=msg.worker, reason=msg.reason, detail=msg.detail)
            failed = msg.reason == RejectReason.TRAIN_FAILED  # the group's failure, not the worker's (buffer.py)
            if failed and self._group_failed(msg.group_id, f"the trainer could not train it: {msg.detail}"):
                return
        if msg.expel:
            self._expel(msg.worker, f"{msg.reason}: {msg.detail}", now)
        self._nudge()

    def _expel(self, name: str, why: str, now: float) -> None:
        self.expelled.add(name)
        self.expelled_at, self.expelled_why = now, why
        if self.keys_of.get(name) == name:  # its own key (a role-wide key would expel its peers too)
            self.expelled_keys.add(name)
        member = self.members.get(name)
        self.log("member_expelled", member=name, reason=why)
        self.notice(f"expelled {name} for the rest of the run: its groups were refused ({why})")
        if member is not None:
            self._to_member(name, Shutdown(reason=f"expelled: {why}", epoch=self.epoch, version=self.version))
            self._remove(member, "expelled")

    def _nudge(self) -> None:
        if self.work.queue:
            for name in self.work.take_waiting():
                self._to_member(name, self._epoch_start())

    # --- evaluation (prl_actors/coordinator/evaluation.py) -----------------------------------------------------

    def _start_eval(self, epoch: int, final: bool) -> bool:
        """Queue the evaluation of v_epoch when it is due; True when one was started."""
        plan = self.eval_plan
        if plan is None or not plan.due(epoch, self.s.epochs):
            return False
        if self.eval_epoch == epoch:  # already under way (an epoch_open retried)
            return True
        self.eval_epoch, self.final_eval = epoch, final
        self.eval_work = EpochWork([p.group_id for p in plan.prompts()])
        self.eval_results, self.eval_started = {}, self.now
        self.log("eval_start", eval_epoch=epoch, eval_version=version_for(epoch), prompts=self.eval_work.total)
        return True

    def _eval_blocks(self) -> bool:
        """An evaluation is under way (the workers must keep its weights until it is done)."""
        return self.eval_epoch >= 0 and not self.eval_work.complete

    def _finish_run(self, epoch: int) -> None:
        """The last step is done: evaluate the final weights first when due, then end the run."""
        self.final_epoch = epoch
        if self._eval_blocks():  # the last epoch's own evaluation: the final one waits for it
            return
        if not self.final_eval and self._start_eval(epoch, final=True):
            for m in self.members.of_role(Role.WORKER):
                self._to_member(m.name, self._eval_start())  # fetch the final weights
            return
        self._shutdown("completed")

    def _eval_start(self) -> EpochStart:
        return EpochStart(epoch=self.eval_epoch, version=version_for(self.eval_epoch), groups=0)

    def _assign_eval(self, inbound: Inbound[WorkRequest], member: Member) -> bool:
        """Hand eval prompts to an idle worker holding the evaluated weights, when any are queued."""
        msg, plan = inbound.msg, self.eval_plan
        if plan is None or not msg.eval_ok or not self._eval_blocks() or not self.eval_work.queue:
            return False
        if msg.version != version_for(self.eval_epoch):
            return False
        workers = len(self.members.of_role(Role.WORKER))
        share = self.eval_work.fair_share(member.name, workers)
        if share == 0:
            return False
        ids = self.eval_work.assign(member.name, min(max(1, msg.max_groups), self.s.max_groups_per_request, share))
        by_id = {p.group_id: p for p in plan.prompts()}
        reply = EvalAssign(
            reply_to=msg.id,
            epoch=self.eval_epoch,
            version=version_for(self.eval_epoch),
            prompts=[by_id[i] for i in ids],
            samples=plan.samples,
        )
        self.reply(inbound, reply)
        self.log("eval_assign", worker=member.name, prompts=ids, msg_id=reply.id, request_id=msg.id)
        return True

    @handles(EvalResult)
    def on_eval_result(self, now: float, inbound: Inbound[EvalResult]) -> None:
        msg = inbound.msg
        self.reply(inbound, Ack(reply_to=msg.id))
        if msg.epoch != self.eval_epoch or msg.version != version_for(self.eval_epoch) or not self._eval_blocks():
            self.log("eval_result_ignored", worker=msg.sender, msg_epoch=msg.epoch, msg_version=msg.version)
            return
        mine = set(self.eval_work.held_by(msg.sender))
        for g in msg.groups:
            if g.prompt_id in mine and self.eval_work.accept(g.prompt_id)[0] is Accept.NEW:
                self.eval_results[g.prompt_id] = g
        self._release_eval(msg.sender, "not returned")
        if self.eval_work.complete:
            self._eval_done(now)

    def _release_eval(self, worker: str, reason: str) -> None:
        lost = self.eval_work.release(worker)
        if lost:
            self.log("eval_requeue", worker=worker, prompts=lost, reason=reason)
            for name in self.work.take_waiting():
                self._to_member(name, self._eval_start() if self.final_eval else self._epoch_start())

    def _eval_done(self, now: float) -> None:
        plan = self.eval_plan
        assert plan is not None
        epoch, version = self.eval_epoch, version_for(self.eval_epoch)
        groups = [self.eval_results[g] for g in sorted(self.eval_results)]
        summary: dict[str, float] = {"epoch": epoch, "version": version, **summarize(groups, plan.samples)}
        summary["eval_s"] = round(now - self.eval_started, 6)
        plan.done.add(epoch)
        self.eval_last = summary
        self.log("eval_done", eval_epoch=epoch, eval_version=version, summary=summary)
        if self.eval_sink is not None:
            self.eval_sink.eval_result(epoch, version, groups, summary)
        self.eval_epoch = -1
        if self.final_epoch >= 0:  # the last step was done while this evaluation ran (or it was the final one)
            self._finish_run(self.final_epoch)
        else:
            self._maybe_open()  # the next epoch may have waited for this evaluation

    # --- helpers -----------------------------------------------------------------------------

    def _open_epoch(self) -> int:
        """The epoch whose work is out (-1 when none is)."""
        return self.epoch if self.phase.epoch_open else -1

    def _epoch_start(self) -> EpochStart:
        start = EpochStart(epoch=self.epoch, version=self._floor(self.epoch), groups=self.s.groups_per_epoch)
        return self._with_news(start)

    def _with_news(self, msg: News) -> News:
        """Bounded mode (k >= 1): `msg` with the weights news a worker's pull policy needs
        (weights/pulls.py): the newest published version and the KLs of the steps from the open epoch's
        floor (of the last epoch opened) up to it. Periodic, sync and k = 0: `msg` unchanged."""
        if not self.s.max_staleness or self.available_version < 0:
            return msg
        newest = self.available_version
        if self._eval_blocks():  # no drift pull past the evaluated weights: workers must keep them until it is done
            newest = min(newest, version_for(self.eval_epoch))
        floor = self._floor(self.epoch) if self.epoch >= 0 else 0
        oldest = max(floor, newest - self.s.max_staleness - 1)  # at most k + 1 steps (a resume)
        msg.newest = newest
        msg.step_kls = to_wire(newest, oldest, self.step_kls)
        return msg

    def _floor(self, epoch: int) -> int:
        """The version a worker must hold at least to generate `epoch` (v_e; v_{e-k} in bounded mode):
        what Welcome, EpochStart, HeartbeatAck and NoWork tell workers."""
        return floor_version(epoch, self._bound(epoch))

    def _bound(self, epoch: int) -> int:
        """k for `epoch`: run.max_staleness, but 0 in bounded mode for an epoch whose weights v_e are
        evaluated (due, or opened so). Such an epoch opens only once v_e is published, every worker
        loads v_e to generate it (nothing newer exists before its step), and the next epoch waits for
        the evaluation (`_maybe_open_bounded`), so the eval prompts find workers holding exactly v_e:
        the pipeline pauses at that epoch and the evaluation runs as in periodic mode. Fixed once the
        epoch opens (`strict_epoch`), whenever the evaluation ends."""
        k = self.s.max_staleness
        if not k or epoch == self.strict_epoch:
            return 0
        due = self.eval_plan is not None and epoch < self.s.epochs and self.eval_plan.due(epoch, self.s.epochs)
        return 0 if due else k

    def _to_member(self, name: str, msg: Msg) -> None:
        """Send a copy of `msg` (with its own id) to a member."""
        member = self.members.get(name)
        if member is not None:
            self.emit(Dest.reply(member.identity), msgspec.structs.replace(msg, id=new_id()))
