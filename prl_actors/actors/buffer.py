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
Accepted groups go to the Trainer as `TrainGroup` under credit-based flow control: one credit per
group, returned by the trainer after consuming it. `periodic` streams each group on arrival; `sync`
holds the epoch's groups and releases the whole batch when the last one arrives.
The stream per epoch is: EpochOpen, TrainGroup x B (seq 0..B-1), EpochComplete.
Dynamic sampling (EpochOpen.id_bound > 0, actors/dynamic_sampling.py): group ids run over
0..id_bound-1; a group whose rewards are all equal is accepted (and reported to the coordinator with
informative=false) but never streamed (`group_filtered`); the epoch ends when the coordinator sends
EpochClose, and EpochComplete then carries the number of groups streamed (kept) and generated.
"""

from __future__ import annotations

from collections import deque

from prl_actors.actors import tickets
from prl_actors.actors.dynamic_sampling import informative
from prl_actors.actors.runtime import Core, handles
from prl_actors.logs import EventLog
from prl_actors.protocol.messages import (
    Ack,
    Credit,
    EpochClose,
    EpochComplete,
    EpochOpen,
    ErrorCode,
    GroupAccepted,
    GroupAck,
    GroupResult,
    Msg,
    RejectReason,
    Role,
    TrainGroup,
)
from prl_actors.protocol.versions import within_bound
from prl_actors.transport.port import Dest, Inbound


class BufferCore(Core):
    role = Role.BUFFER

    def __init__(
        self, name: str, log: EventLog, mode: str, group_size: int, max_groups: int, max_staleness: int = 0
    ) -> None:
        super().__init__(name, log)
        self.mode, self.group_size, self.max_groups = mode, group_size, max_groups
        self.max_staleness = max_staleness  # k (run.mode bounded); 0 = strict on-policy
        self.groups = 0  # B of the open epoch (0 = none open)
        self.accepted: set[int] = set()
        self.held: list[TrainGroup] = []  # sync mode: the epoch's groups until the batch is complete
        self.stream: deque[Msg] = deque()  # what goes to the trainer, in order
        self.credits = 0
        self.trainer: bytes = b""
        self.seq = 0
        self.following: dict[str, int] = {}  # worker -> groups it said follow its last accepted one
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
            self.following = {}
            self.id_bound, self.closed = msg.id_bound, False
            self.stream.append(EpochOpen(epoch=msg.epoch, version=msg.version, groups=msg.groups))
            self._pump()
        self.reply(inbound, Ack(reply_to=msg.id, epoch=msg.epoch, version=msg.version))

    # --- from workers ----------------------------------------------------------------------------

    @handles(GroupResult)
    def on_group_result(self, now: float, inbound: Inbound[GroupResult]) -> None:
        msg = inbound.msg
        group = msg.group
        why = self._not_assigned(msg)
        if why:
            self.refuse(inbound, why, ErrorCode.FORBIDDEN, quiet=True)
            return
        reason = self._reject_reason(msg.epoch, msg.version, group.group_id, len(group.samples))
        fields = dict(group_id=group.group_id, worker=group.worker, msg_id=msg.id, msg_epoch=msg.epoch)
        if reason is not None:
            self.count(f"rejected.{reason}")
            self.log("group_rejected", reason=reason, msg_version=msg.version, **fields)
            self.reply(inbound, GroupAck(reply_to=msg.id, group_id=group.group_id, accepted=False, reason=reason))
            return
        self.accepted.add(group.group_id)
        self.following[msg.sender] = min(max(msg.follows, 0), self.groups)
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
        if not self.id_bound and len(self.accepted) == self.groups:
            self._complete(now, self.groups)
        self._pump()

    def _complete(self, now: float, groups: int, generated: int = 0) -> None:
        """End the epoch's stream: the held groups (sync), then EpochComplete."""
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
        return len(self.accepted) + sum(self.following.values()) >= self.groups
