"""Coordinator: turns messages into decisions of three plain parts it owns.

- `Membership` (membership.py): who is in the run, liveness;
- `EpochWork` (epoch_work.py): the open epoch's groups, queued / held / done (exactly-once rules);
- `PhaseMachine` (phase.py): the epoch state machine;
and decides through rule parts that read and write its state (socket-free, as the core is):
`Opening` (opening.py: the epoch pipeline, bounded mode's bound and news), `Assigner` (assignment.py),
`Admission` (admission.py: who may join), `Recovery` (recovery.py: given back, refused, overdue,
expelled), `Evaluations` (evaluating.py), `Sampling` (sampling.py: dynamic sampling's rounds) and
`StallWatch` (stall.py).
Invariants it keeps:
- epoch e is bound to weights v_e (protocol/versions.py); a worker is given epoch-e work only when its
  WorkRequest says it holds v_e (on-policy), or, under run.mode bounded with k = max_staleness, any
  of v_{e-k} .. v_e (`within_bound`); then epoch e+1 opens as soon as epoch e is generated and
  v_{e+1-k} is published (`may_open`), before the trainer has made v_{e+1}; except an epoch whose
  weights are evaluated (`Opening.bound`): it opens at v_e, is generated with v_e only, and the next epoch
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
from typing import TYPE_CHECKING

import msgspec

from prl_actors.coordinator.admission import Admission
from prl_actors.coordinator.assignment import Assigner
from prl_actors.coordinator.epoch_work import Accept, EpochWork
from prl_actors.coordinator.evaluating import Evaluations
from prl_actors.coordinator.evaluation import EvalPlan, EvalSink
from prl_actors.coordinator.opening import Opening
from prl_actors.coordinator.phase import PhaseMachine
from prl_actors.coordinator.recovery import Recovery
from prl_actors.coordinator.sampling import Sampling
from prl_actors.coordinator.stall import FIRST_WEIGHTS_GRACE_S as FIRST_WEIGHTS_GRACE_S  # re-exported (tests)
from prl_actors.coordinator.stall import STALL_LOG_S as STALL_LOG_S
from prl_actors.coordinator.stall import StallWatch
from prl_actors.protocol import tickets
from prl_actors.protocol.messages import (
    Ack,
    ErrorCode,
    EvalGroup,
    EvalResult,
    GenerationContract,
    GiveBack,
    GroupAccepted,
    GroupRefused,
    Heartbeat,
    HeartbeatAck,
    Leave,
    MemberInfo,
    Msg,
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
    WorkRequest,
    new_id,
)
from prl_actors.protocol.versions import epoch_for, version_for
from prl_actors.runtime.core import REFUSALS, Core, handles
from prl_actors.runtime.faults import armed, kill_point
from prl_actors.runtime.membership import Member, Membership
from prl_actors.training.dynamic_sampling import Rounds
from prl_actors.transport.port import Dest, Inbound

if TYPE_CHECKING:
    from prl_actors.records.logs import EventLog
    from prl_actors.tasks.base import Task


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
    contract: GenerationContract | None = None  # the run's (runtime/contract.py); None: workers are not checked


NOTICES_KEPT = 20
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
        self.stall_reason = ""
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
        self.strict_epoch = -1  # bounded mode: the last epoch opened at k = 0 for its evaluation (`Opening.bound`)
        # the rule parts (they read and write the state above)
        self.opening = Opening(self)
        self.assigner = Assigner(self)
        self.admission = Admission(self)
        self.recovery = Recovery(self)
        self.evals = Evaluations(self)
        self.sampling = Sampling(self)
        self.stall = StallWatch(self)
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
        orphaned = self.stall.orphaned(now)
        if silent or overdue or self.requests.any_due(now) or orphaned:  # it decides something
            self.log("coord_input", now=now, tick=True)  # logged before its effects, which replay compares
        super().tick(now)
        for m in silent:
            self.remove(m, "heartbeat_timeout")
        for worker, groups in overdue.items():
            self.recovery.hold_expired(worker, groups)
        if orphaned:
            self.shutdown(orphaned)
            return
        self.stall.watch(now)

    def _stall_reason(self) -> str:
        """Why the run waits now (StallWatch.reason)."""
        return self.stall.reason()

    # --- membership --------------------------------------------------------------------------

    @handles(Register)
    def on_register(self, now: float, inbound: Inbound[Register]) -> None:
        msg = inbound.msg
        if self.admission.refused(now, inbound):
            return
        old = self.members.get(msg.sender)
        if old is not None:  # the same process again, or a dead one's successor: its old work is lost
            self.remove(old, "re_registered")
        self.members.join(msg.sender, msg.role, inbound.identity, now, pid=msg.pid, host=msg.host, key=inbound.who)
        self.keys_of[msg.sender] = inbound.principal
        self.log("member_join", member=msg.sender, member_role=msg.role, pid=msg.pid, host=msg.host)
        if msg.role == Role.BUFFER and self.phase.is_(Phase.WAITING_WEIGHTS):
            self.opening.maybe_open()
        if msg.role == Role.WORKER and self.final_eval:  # a worker joining during the final evaluation
            self.to_member(msg.sender, self.evals.start_msg())
        epoch = self._open_epoch()
        welcome = Welcome(
            reply_to=msg.id,
            epoch=epoch,
            version=self.opening.floor(epoch) if epoch >= 0 else -1,
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

    @handles(Heartbeat)
    def on_heartbeat(self, now: float, inbound: Inbound[Heartbeat]) -> None:
        member = self.members.get(inbound.msg.sender)
        if member is not None:
            member.version, member.refused = inbound.msg.version, inbound.msg.refused
        epoch = self._open_epoch()
        version = self.opening.floor(epoch) if epoch >= 0 else -1
        ack = HeartbeatAck(reply_to=inbound.msg.id, known=member is not None, epoch=epoch, version=version)
        self.reply(inbound, self.opening.with_news(ack))

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
            self.remove(member, f"leave:{inbound.msg.reason}" if inbound.msg.reason else "leave")
        self.reply(inbound, Ack(reply_to=inbound.msg.id))

    def remove(self, member: Member, reason: str) -> None:
        self.members.remove(member.name)
        self.log("member_leave", member=member.name, member_role=member.role, reason=reason)
        lost = self.work.release(member.name)
        if lost:
            self.log("requeue", worker=member.name, groups=lost, reason=reason)
            for name in self.work.take_waiting():
                self.to_member(name, self.opening.epoch_start())
        self.evals.release(member.name, reason)

    # --- work --------------------------------------------------------------------------------

    @handles(WorkRequest)
    def on_work_request(self, now: float, inbound: Inbound[WorkRequest]) -> None:
        self.assigner.request(now, inbound)

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
        if self.rounds is not None and self.sampling.another_round(msg):
            return
        if self.work.complete:  # the step's weights may have come first (the buffer's accept raced them)
            self.opening.generated()

    # --- epochs ------------------------------------------------------------------------------

    @handles(WeightsAvailable)
    def on_weights_available(self, now: float, inbound: Inbound[WeightsAvailable]) -> None:
        self.available_version = max(self.available_version, inbound.msg.version)
        self.reply(inbound, Ack(reply_to=inbound.msg.id))
        self.opening.maybe_open()

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
            self.evals.finish_run(epoch_for(msg.version))
        else:
            self.opening.maybe_open()

    @handles(Ack)
    def on_ack(self, now: float, inbound: Inbound[Ack]) -> None:
        if self.phase.is_(Phase.OPENING) and inbound.msg.reply_to == self.opening.open_id:
            self.phase.to(Phase.RUNNING)
            self.log("epoch_open", groups=self.s.groups_per_epoch)
            for m in self.members.of_role(Role.WORKER, Role.TRAINER):
                self.to_member(m.name, self.opening.epoch_start())

    def shutdown(self, reason: str) -> None:
        self.done_reason = reason
        self.phase.to(Phase.DONE)
        self.log("run_done", reason=reason, epochs_completed=self.epochs_completed)
        for m in self.members.sorted():
            self.to_member(m.name, Shutdown(reason=reason, epoch=self.epoch, version=version_for(self.epoch)))
        self.stopped = True

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
        self.shutdown(f"stop requested: {inbound.msg.reason}" if inbound.msg.reason else "stop requested")

    # --- failures: given back, refused, overdue (issue 23; recovery.py) ------------------------

    def forbidden(self, inbound: Inbound[Msg]) -> str:
        """An expelled member's name, or its own key, is refused whatever it sends."""
        if inbound.msg.sender in self.expelled or (inbound.principal and inbound.principal in self.expelled_keys):
            return f"{inbound.msg.sender!r} was expelled from this run (run.max_bad_groups)"
        return super().forbidden(inbound)

    def hold_deadline_s(self) -> float:
        """How long a worker may hold a group (Recovery.deadline_s)."""
        return self.recovery.deadline_s()

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
        self.recovery.requeue_failed(mine, f"{msg.sender}: {msg.error}")

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
            if failed and self.recovery.group_failed(msg.group_id, f"the trainer could not train it: {msg.detail}"):
                return
        if msg.expel:
            self.recovery.expel(msg.worker, f"{msg.reason}: {msg.detail}", now)
        self.assigner.nudge()

    # --- evaluation (evaluating.py) ------------------------------------------------------------

    @handles(EvalResult)
    def on_eval_result(self, now: float, inbound: Inbound[EvalResult]) -> None:
        self.evals.result(now, inbound)

    # --- helpers -----------------------------------------------------------------------------

    def _open_epoch(self) -> int:
        """The epoch whose work is out (-1 when none is)."""
        return self.epoch if self.phase.epoch_open else -1

    def to_member(self, name: str, msg: Msg) -> None:
        """Send a copy of `msg` (with its own id) to a member."""
        member = self.members.get(name)
        if member is not None:
            self.emit(Dest.reply(member.identity), msgspec.structs.replace(msg, id=new_id()))
