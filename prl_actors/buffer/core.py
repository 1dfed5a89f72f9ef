"""RolloutBuffer: admits each group of the open epoch exactly once and streams it to the Trainer.

Who: a group is admitted only from the worker the coordinator assigned it to — the sender's key
covers its name (runtime.Core), `group.worker` is that name, and the group carries the coordinator's
ticket for exactly (epoch, group id, worker) (tickets.py; the key arrives with EpochOpen).
Otherwise the reply is `error` `forbidden` and nothing changes. Credits come only from the trainer.
Admission (in this order; the first failing rule is the rejection reason, counted and logged):
  wrong_epoch / epoch_closed  the group's epoch is not the open one
  stale_version               its version is not the open epoch's version (on-policy), or, under
                              run.mode bounded, older than v_{e-k} (`versions.within_bound`)
  unknown_group               its group id is not one of the epoch's 0..B-1
  bad_group_size              it does not hold G samples
  duplicate                   (epoch, group id) was already accepted
  buffer_full                 more than buffer.max_groups groups wait for the trainer
  dropped                     the coordinator gave up on the group (task.on_error skip)
  expelled                    its sender was expelled (below)
Content (buffer/group_check.py, after the rules above): non_finite, bad_tokens, too_long,
wrong_prompt, bad_text, reward_mismatch. A group refused for its content (or for its size) is
counted against its worker and reported to the coordinator (GroupRefused), which requeues it for
another worker; the `max_bad_groups`-th refusal expels the worker (`expel` in that report): its
groups are refused from then on. A group the trainer refuses later (GroupRefused train_failed: its
forward/backward failed alone) is requeued the same way but counted against the group, not the
worker: the coordinator gives it up after run.max_group_failures failures (task.on_error).
Accepted groups go to the Trainer as `TrainGroup` under credit-based flow control: one credit per
group, returned by the trainer after consuming it. `periodic` streams each group on arrival; `sync`
holds the epoch's groups and releases the whole batch when the last one arrives.
The stream per epoch is: EpochOpen, TrainGroup x B (seq 0..B-1), EpochComplete.
Dynamic sampling (EpochOpen.id_bound > 0, training/dynamic_sampling.py): group ids run over
0..id_bound-1; a group whose rewards are all equal is accepted (and reported to the coordinator with
informative=false) but never streamed (`group_filtered`); the epoch ends when the coordinator sends
EpochClose, and EpochComplete then carries the number of groups streamed (kept) and generated.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from prl_actors.buffer.bursts import Bursts
from prl_actors.buffer.group_check import GroupChecker
from prl_actors.protocol import tickets
from prl_actors.protocol.messages import (
    Ack,
    Credit,
    EpochClose,
    EpochComplete,
    EpochOpen,
    ErrorCode,
    Group,
    GroupAccepted,
    GroupAck,
    GroupDropped,
    GroupRefused,
    GroupResult,
    Msg,
    RejectReason,
    Role,
    TrainGroup,
)
from prl_actors.protocol.versions import within_bound
from prl_actors.runtime.core import Core, handles
from prl_actors.runtime.faults import kill_point
from prl_actors.training.dynamic_sampling import informative
from prl_actors.transport.port import Dest, Inbound

if TYPE_CHECKING:
    from prl_actors.records.logs import EventLog


class BufferCore(Core):
    role = Role.BUFFER

    def __init__(
        self,
        name: str,
        log: EventLog,
        mode: str,
        group_size: int,
        max_groups: int,
        checker: GroupChecker | None = None,
        max_bad_groups: int = 0,
        max_staleness: int = 0,
    ) -> None:
        super().__init__(name, log)
        self.mode, self.group_size, self.max_groups = mode, group_size, max_groups
        self.max_staleness = max_staleness  # k (run.mode bounded); 0 = strict on-policy
        self.checker = checker or GroupChecker()
        self.max_bad_groups = max_bad_groups  # 0: never expel
        self.bad: dict[str, int] = {}  # worker -> its groups refused for their content
        self.expelled: set[str] = set()
        self.senders: dict[int, str] = {}  # group id -> the worker whose group was accepted (this epoch)
        self.dropped: set[int] = set()  # groups the coordinator gave up on (task.on_error skip)
        self.noted = False  # the checker's note (checks it cannot run) was logged
        self.groups = 0  # B of the open epoch (0 = none open)
        self.accepted: set[int] = set()
        self.held: list[TrainGroup] = []  # sync mode: the epoch's groups until the batch is complete
        self.stream: deque[Msg] = deque()  # what goes to the trainer, in order
        self.credits = 0
        self.trainer: bytes = b""
        self.seq = 0
        self.bursts = Bursts()  # groups announced by workers' bursts (GroupResult.follows)
        self.opened_at = 0.0
        self.ticket_keys: list[bytes] = []  # the coordinator's (a restarted coordinator adds one)
        self.id_bound = 0  # dynamic sampling: group ids 0..id_bound-1 (0 = off: 0..groups-1)
        self.closed = False  # dynamic sampling: EpochClose came, EpochComplete is in the stream

    def start(self, now: float) -> None:
        self.register()

    # --- from the coordinator -------------------------------------------------------------------

    @handles(EpochOpen)
    def on_epoch_open(self, now: float, inbound: Inbound[EpochOpen]) -> None:
        msg = inbound.msg
        if msg.ticket_key and msg.ticket_key not in self.ticket_keys:
            self.ticket_keys = [*self.ticket_keys[-7:], msg.ticket_key]
        if msg.epoch != self.epoch:
            if self.groups and len(self.accepted) < self.groups:
                self.log("epoch_abandoned", accepted=len(self.accepted), groups=self.groups)
            self.epoch, self.version, self.groups = msg.epoch, msg.version, msg.groups
            self.accepted, self.held, self.seq, self.opened_at = set(), [], 0, now
            self.senders, self.dropped = {}, set()
            self.bursts.reset()
            self.id_bound, self.closed = msg.id_bound, False
            self.stream.append(EpochOpen(epoch=msg.epoch, version=msg.version, groups=msg.groups))
            self._pump()
        self.reply(inbound, Ack(reply_to=msg.id, epoch=msg.epoch, version=msg.version))

    # --- from workers ----------------------------------------------------------------------------

    @handles(GroupResult)
    def on_group_result(self, now: float, inbound: Inbound[GroupResult]) -> None:
        msg = inbound.msg
        group = msg.group
        if self.accepted:  # a group of the epoch is in already
            kill_point(self.name, "mid_epoch", self.epoch)
        why = self._not_assigned(msg)
        if why:
            self.refuse(inbound, why, ErrorCode.FORBIDDEN, quiet=True)
            return
        reason = self._reject_reason(msg.epoch, msg.version, group.group_id, len(group.samples))
        fields = dict(group_id=group.group_id, worker=group.worker, msg_id=msg.id, msg_epoch=msg.epoch)
        if group.worker in self.expelled:
            reason = RejectReason.EXPELLED
        bad = self._bad_content(msg, reason)
        if bad is not None:
            self._refuse_group(inbound, bad[0], bad[1])
            return
        if reason is not None:
            self.count(f"rejected.{reason}")
            self.log("group_rejected", reason=reason, msg_version=msg.version, **fields)
            self.reply(inbound, GroupAck(reply_to=msg.id, group_id=group.group_id, accepted=False, reason=reason))
            return
        self.accepted.add(group.group_id)
        self.senders[group.group_id] = group.worker
        self.bursts.accepted(msg.sender, msg.follows, self.groups)
        self.count("accepted")
        self.log("group_accepted", **fields, accepted=len(self.accepted), groups=self.groups)
        self.reply(inbound, GroupAck(reply_to=msg.id, group_id=group.group_id, accepted=True))
        useful = informative([x.reward for x in group.samples])
        accepted = GroupAccepted(
            epoch=msg.epoch, version=msg.version, group_id=group.group_id, worker=group.worker, informative=useful
        )
        self.emit(Dest.peer("coordinator"), accepted)
        if self.id_bound and not useful:
            self._filtered(group.group_id)
            return
        item = TrainGroup(epoch=msg.epoch, version=msg.version, seq=self.seq, group=group)
        self.seq += 1
        if self.mode == "sync":
            self.held.append(item)
        else:
            self.stream.append(item)
        self._maybe_complete(now)
        self._pump()

    def _complete(self, now: float, groups: int, generated: int = 0) -> None:
        """End the epoch's stream: the held groups (sync), then EpochComplete."""
        kill_point(self.name, "before_complete", self.epoch)
        self.stream.extend(self.held)
        self.held = []
        gen_s = round(now - self.opened_at, 6)
        done = EpochComplete(epoch=self.epoch, version=self.version, groups=groups, gen_s=gen_s, generated=generated)
        self.stream.append(done)
        self.log("batch_complete", groups=groups, generated=generated or groups)

    # --- dynamic sampling ------------------------------------------------------------------------

    def _filtered(self, group_id: int) -> None:
        """An accepted group with equal rewards under dynamic sampling: done, never trained."""
        self.count("filtered")
        self.log("group_filtered", group_id=group_id, msg_epoch=self.epoch, accepted=len(self.accepted))

    @handles(EpochClose)
    def on_epoch_close(self, now: float, inbound: Inbound[EpochClose]) -> None:
        """The coordinator's sampling rounds are over: the `seq` groups streamed are the epoch's."""
        msg = inbound.msg
        if msg.epoch == self.epoch and self.id_bound and not self.closed:
            self.closed = True
            if msg.groups != self.seq or msg.generated != len(self.accepted):
                self.log("close_mismatch", kept=self.seq, accepted=len(self.accepted), told=msg.groups)
            self._complete(now, self.seq, len(self.accepted))
            self._pump()
        self.reply(inbound, Ack(reply_to=msg.id, epoch=msg.epoch, version=msg.version))

    def _maybe_complete(self, now: float) -> None:
        """Every group of the epoch is accepted or dropped (task.on_error skip): end the stream with the
        number of groups sent (dynamic sampling ends it on EpochClose instead)."""
        if self.id_bound or not self.groups or len(self.accepted) + len(self.dropped) != self.groups:
            return
        if self.dropped:
            self.log("groups_dropped", dropped=sorted(self.dropped))
        self._complete(now, len(self.accepted))

    @handles(GroupDropped)
    def on_group_dropped(self, now: float, inbound: Inbound[GroupDropped]) -> None:
        msg = inbound.msg
        self.reply(inbound, Ack(reply_to=msg.id, epoch=msg.epoch, version=msg.version))
        if msg.epoch != self.epoch or msg.group_id in self.accepted or msg.group_id in self.dropped:
            return
        self.dropped.add(msg.group_id)
        self.log("group_dropped", group_id=msg.group_id, msg_epoch=msg.epoch, reason=msg.reason)
        self._maybe_complete(now)
        self._pump()

    def _check(self, epoch: int, group: Group) -> tuple[RejectReason, str] | None:
        verdict = self.checker.check(epoch, group)
        if self.checker.note and not self.noted:
            self.noted = True
            self.log("checks_limited", reason=self.checker.note)
        return verdict

    def _bad_content(self, msg: GroupResult, reason: RejectReason | None) -> tuple[RejectReason, str] | None:
        """The group's fault (its size, then its content), or None; only for a group of the open
        epoch that would otherwise be admitted (a late or duplicate one is not the sender's fault)."""
        if reason == RejectReason.BAD_GROUP_SIZE:
            return reason, f"{len(msg.group.samples)} samples, the run's group size is {self.group_size}"
        if reason is not None:
            return None
        return self._check(msg.epoch, msg.group)

    def _refuse_group(self, inbound: Inbound[GroupResult], reason: RejectReason, detail: str) -> None:
        msg = inbound.msg
        gid = msg.group.group_id
        self.reply(inbound, GroupAck(reply_to=msg.id, group_id=gid, accepted=False, reason=reason))
        self._bad_group(msg.epoch, gid, msg.group.worker, reason, detail, msg.id)

    def _bad_group(
        self, epoch: int, gid: int, worker: str, reason: RejectReason, detail: str, msg_id: str, blame: bool = True
    ) -> None:
        """Count a refused group against `worker` (unless not `blame`) and tell the coordinator to
        requeue it."""
        self.count(f"rejected.{reason}")
        n = self.bad[worker] = self.bad.get(worker, 0) + int(blame)
        expel = blame and bool(self.max_bad_groups) and n >= self.max_bad_groups and worker not in self.expelled
        if expel:
            self.expelled.add(worker)
        self.log(
            "group_rejected", reason=reason, detail=detail, group_id=gid, worker=worker, msg_id=msg_id,
            msg_epoch=epoch, bad=n, expel=expel,
        )  # fmt: skip
        refused = GroupRefused(
            epoch=epoch, version=self.version, group_id=gid, worker=worker, reason=reason, detail=detail, expel=expel
        )
        self.emit(Dest.peer("coordinator"), refused)

    @handles(GroupRefused)
    def on_group_refused(self, now: float, inbound: Inbound[GroupRefused]) -> None:
        """The trainer could not train this group alone: it is no longer accepted (a regenerated one
        is). It does not count against the worker that sent it: its content passed the checks, and a
        group the trainer cannot train (too long for its memory, a loss that fails on it) fails from
        every worker alike, so blaming them expelled every worker and stalled the run. The coordinator
        counts it against the group instead (run.max_group_failures, task.on_error)."""
        msg = inbound.msg
        if msg.epoch != self.epoch or msg.group_id not in self.accepted:
            self.log("late_refusal_ignored", group_id=msg.group_id, msg_epoch=msg.epoch)
            return
        self.accepted.discard(msg.group_id)
        worker = self.senders.pop(msg.group_id, msg.worker)
        self._bad_group(msg.epoch, msg.group_id, worker, msg.reason, msg.detail, msg.id, blame=False)

    def _not_assigned(self, msg: GroupResult) -> str:
        """Why `msg` is not a group the coordinator assigned to its sender ("" when it is)."""
        gid = msg.group.group_id
        if msg.group.worker != msg.sender:
            return f"group {gid} names worker {msg.group.worker!r} but was sent by {msg.sender!r}"
        if not tickets.valid(self.ticket_keys, msg.ticket, msg.epoch, gid, msg.sender):
            return f"group {gid} of epoch {msg.epoch} was not assigned to {msg.sender!r} (no valid ticket)"
        return ""

    def _reject_reason(self, epoch: int, version: int, group_id: int, n_samples: int) -> RejectReason | None:
        if self.groups == 0 or epoch > self.epoch:
            return RejectReason.WRONG_EPOCH
        if epoch < self.epoch:
            return RejectReason.EPOCH_CLOSED
        if not within_bound(self.epoch, version, self.max_staleness):
            return RejectReason.STALE_VERSION
        if not 0 <= group_id < (self.id_bound or self.groups):
            return RejectReason.UNKNOWN_GROUP
        if n_samples != self.group_size:
            return RejectReason.BAD_GROUP_SIZE
        if group_id in self.accepted:
            return RejectReason.DUPLICATE
        if group_id in self.dropped:
            return RejectReason.DROPPED
        if len(self.stream) + len(self.held) >= self.max_groups:
            return RejectReason.BUFFER_FULL
        return None

    # --- to the trainer --------------------------------------------------------------------------

    @handles(Credit)
    def on_credit(self, now: float, inbound: Inbound[Credit]) -> None:
        if inbound.identity != self.trainer:
            self.log("trainer_connected", trainer=inbound.msg.sender)
            self.trainer = inbound.identity
        self.credits += inbound.msg.n
        self._pump()

    def _pump(self) -> None:
        """Send in stream order: markers need no credit, each TrainGroup takes one."""
        while self.trainer and self.stream:
            head = self.stream[0]
            if isinstance(head, TrainGroup):
                if self.credits <= 0:
                    return
                self.credits -= 1
                head.generated = self._generated_hint()
                self.log("group_streamed", group_id=head.group.group_id, seq=head.seq, credits=self.credits)
            self.stream.popleft()
            self.emit(Dest.reply(self.trainer), head)

    def _generated_hint(self) -> bool:
        """Is every group of the epoch in the buffer or on its way (TrainGroup.generated)?"""
        if self.id_bound:
            return self.closed
        return self.bursts.generated(len(self.accepted) + len(self.dropped), self.groups)
