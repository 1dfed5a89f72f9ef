"""The epoch pipeline, a part of the coordinator: when an epoch opens, which weights it is bound to,
and the weights news bounded mode's workers get.

Periodic mode: epoch e opens once v_e exists and epoch e-1 is generated. Bounded mode (k =
run.max_staleness >= 1): once epoch e is generated, e+1 opens as soon as v_{e+1-k} exists
(`may_open`), except around an evaluated epoch (`bound`: k = 0 there, the pipeline pauses). An epoch
opens at the buffer (EpochOpen, retried after a request timeout); the buffer's Ack sets it running."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from prl_actors.coordinator.epoch_work import EpochWork
from prl_actors.protocol.messages import EpochOpen, EpochStart, HeartbeatAck, Phase, Role
from prl_actors.protocol.versions import epoch_for, floor_version, may_open, version_for
from prl_actors.transport.port import Dest
from prl_actors.weights.pulls import to_wire

if TYPE_CHECKING:
    from prl_actors.coordinator.core import CoordinatorCore

News = TypeVar("News", EpochStart, HeartbeatAck)  # the messages that carry bounded mode's weights news


class Opening:
    def __init__(self, core: CoordinatorCore) -> None:
        self.core = core
        self.open_id = ""  # the EpochOpen whose Ack opens the epoch

    def maybe_open(self) -> None:
        """Open the epoch of weights v as soon as they exist and the previous epoch is fully generated."""
        c = self.core
        if c.s.max_staleness:
            self.maybe_open_bounded()
            return
        v = c.available_version
        e = epoch_for(v)
        if v >= 0 and e >= c.s.epochs and c.phase.is_(Phase.WAITING_WEIGHTS):
            c.evals.finish_run(e)  # resumed from the last epoch's checkpoint: nothing to train
            return
        if v < 0 or e >= c.s.epochs or not c.phase.is_(Phase.WAITING_WEIGHTS, Phase.TRAINING):
            return
        if c.phase.is_(Phase.TRAINING) and e != c.epoch + 1:
            return
        if c.evals.blocks() and c.eval_epoch < e:  # the workers must keep v_e until it is evaluated
            c.log("epoch_open_deferred", reason=f"evaluation of v{version_for(c.eval_epoch)} running")
            return
        self.open(e, v)

    def maybe_open_bounded(self) -> None:
        """run.mode bounded (k >= 1): once epoch e is generated, open e+1 as soon as v_{e+1-k} exists
        (`may_open`), whether or not the trainer has made v_{e+1}. Waiting for weights (start, resume,
        a retried open) it opens the published version's epoch, or the epoch it was opening."""
        c = self.core
        v = c.available_version
        if v < 0:
            return
        if c.phase.is_(Phase.WAITING_WEIGHTS) and epoch_for(v) >= c.s.epochs:
            c.evals.finish_run(epoch_for(v))  # resumed from the last epoch's checkpoint: nothing to train
            return
        if c.phase.is_(Phase.TRAINING):
            e = c.epoch + 1
        elif c.phase.is_(Phase.WAITING_WEIGHTS):
            e = max(epoch_for(v), c.epoch)
        else:
            return
        if e >= c.s.epochs or not may_open(e, v, self.bound(e)):
            return  # the last epoch is generated (StepDone ends the run), or its floor weights are not out
        if c.evals.blocks() and c.eval_epoch < e:  # the workers must keep v_e until it is evaluated
            c.log("epoch_open_deferred", reason=f"evaluation of v{version_for(c.eval_epoch)} running")
            return
        self.open(e, version_for(e))

    def open(self, e: int, v: int) -> None:
        """Open epoch e (bound to v) at the buffer: EpochOpen, whose Ack sets the epoch running."""
        c = self.core
        buffer = c.members.first(Role.BUFFER)
        if buffer is None:
            if c.phase.is_(Phase.TRAINING):
                c.phase.to(Phase.WAITING_WEIGHTS)
            c.log("epoch_open_deferred", reason="no buffer registered")
            return
        c.epoch, c.version = e, v
        c.prompts = {p.group_id: p for p in c.sampling.epoch_prompts(e, range(c.s.groups_per_epoch))}
        c.work = EpochWork(list(c.prompts))
        c.assigned_at, c.failures = {}, {}
        if c.s.max_staleness and self.bound(e) == 0:  # its evaluation pauses the pipeline here
            c.strict_epoch = e
        c.evals.start(e, final=False)
        c.phase.to(Phase.OPENING)
        open_ = EpochOpen(
            epoch=e, version=v, groups=c.s.groups_per_epoch, ticket_key=c.ticket_key, id_bound=c.sampling.id_bound()
        )
        msg = c.emit(Dest.reply(buffer.identity), open_)
        self.open_id = msg.id
        c.expect(msg, c.s.request_timeout_s, "buffer ack of epoch_open", self.open_timed_out)

    def open_timed_out(self, now: float) -> None:
        self.core.log("epoch_open_retry", reason="buffer did not ack epoch_open")
        self.core.phase.to(Phase.WAITING_WEIGHTS)
        self.maybe_open()

    def generated(self) -> None:
        """Every group of the open epoch is done: it trains (and the next epoch may open)."""
        c = self.core
        c.phase.to(Phase.TRAINING)
        c.log("epoch_generated", groups=len(c.work.done))
        if c.rounds is not None:
            c.sampling.close()
        self.maybe_open()

    def epoch_start(self) -> EpochStart:
        c = self.core
        start = EpochStart(epoch=c.epoch, version=self.floor(c.epoch), groups=c.s.groups_per_epoch)
        return self.with_news(start)

    def with_news(self, msg: News) -> News:
        """Bounded mode (k >= 1): `msg` with the weights news a worker's pull policy needs
        (weights/pulls.py): the newest published version and the KLs of the steps from the open epoch's
        floor (of the last epoch opened) up to it. Periodic, sync and k = 0: `msg` unchanged."""
        c = self.core
        if not c.s.max_staleness or c.available_version < 0:
            return msg
        newest = c.available_version
        if c.evals.blocks():  # no drift pull past the evaluated weights: workers must keep them until it is done
            newest = min(newest, version_for(c.eval_epoch))
        floor = self.floor(c.epoch) if c.epoch >= 0 else 0
        oldest = max(floor, newest - c.s.max_staleness - 1)  # at most k + 1 steps (a resume)
        msg.newest = newest
        msg.step_kls = to_wire(newest, oldest, c.step_kls)
        return msg

    def floor(self, epoch: int) -> int:
        """The version a worker must hold at least to generate `epoch` (v_e; v_{e-k} in bounded mode):
        what Welcome, EpochStart, HeartbeatAck and NoWork tell workers."""
        return floor_version(epoch, self.bound(epoch))

    def bound(self, epoch: int) -> int:
        """k for `epoch`: run.max_staleness, but 0 in bounded mode for an epoch whose weights v_e are
        evaluated (due, or opened so). Such an epoch opens only once v_e is published, every worker
        loads v_e to generate it (nothing newer exists before its step), and the next epoch waits for
        the evaluation (`maybe_open_bounded`), so the eval prompts find workers holding exactly v_e:
        the pipeline pauses at that epoch and the evaluation runs as in periodic mode. Fixed once the
        epoch opens (`strict_epoch`), whenever the evaluation ends."""
        c = self.core
        k = c.s.max_staleness
        if not k or epoch == c.strict_epoch:
            return 0
        due = c.eval_plan is not None and epoch < c.s.epochs and c.eval_plan.due(epoch, c.s.epochs)
        return 0 if due else k
