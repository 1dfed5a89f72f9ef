"""The trainer and publisher cores, without sockets: one step per epoch, its row, resume, flushes and
cores; stored and served weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prl_actors.config import load_config
from prl_actors.protocol import messages as m
from prl_actors.publisher.core import PublisherCore
from prl_actors.records.logs import EventLog
from prl_actors.records.rundir import MemorySink, RunDir
from prl_actors.runtime.core import Core
from prl_actors.runtime.threads import ThreadPlan
from prl_actors.trainer.core import TrainerCore
from prl_actors.training.sim import SimLearner
from prl_actors.transport.port import Inbound
from prl_actors.weights.transfer import Assembler, Snapshot, transfer_messages

pytestmark = pytest.mark.fast

# --- the trainer core ------------------------------------------------------------------------------


def sim_learner() -> SimLearner:
    cfg = load_config(None, {"worker.engine": "sim", "trainer.learner": "sim", "sim.train_s_per_sample": 0.0})
    return SimLearner(cfg.sim, cfg.run.seed)


def trainer(sink: MemorySink | RunDir, resume: bool = False) -> TrainerCore:
    log = EventLog("trainer", "trainer")
    return TrainerCore("trainer", log, sim_learner(), sink, 4, 1 << 20, 5.0, resume=resume)


def feed(core: Core, msg: m.Msg, sender: str, now: float = 0.0) -> list[m.Msg]:
    msg.sender = sender
    core.now = now
    core.handle(now, Inbound(msg, [], peer=sender))
    out, core.outbox = core.outbox, []
    return [x for _, x, _ in out]


def group(gid: int, answers: list[int]) -> m.Group:
    samples = [m.Sample(text=str(a), token_ids=[a], logprobs=[0.0], reward=float(a == 4)) for a in answers]
    return m.Group(group_id=gid, prompt="ctx 1", prompt_ids=[1], samples=samples, worker="worker-0")


def test_trainer_one_step_per_epoch_its_row_at_once_and_step_done_after_the_publisher_stored_it() -> None:
    """The epoch's metrics row is written with the step, before its checkpoint (issue 39: a row that
    waited for the publisher was lost when the publisher died after the checkpoint); the coordinator
    hears StepDone only once the publisher stored the weights."""
    sink = MemorySink()
    core = trainer(sink)
    core.start(0.0)
    uploads = [x for _, x, _ in core.outbox]
    assert [m.tag_of(x) for x in uploads][:3] == ["register", "credit", "weights_begin"]
    core.outbox.clear()
    feed(core, m.EpochOpen(epoch=0, version=0, groups=2), "buffer")
    feed(core, m.TrainGroup(epoch=0, version=0, seq=0, group=group(0, [4, 1])), "buffer")
    assert core.learner.version == 0  # accumulating only
    off = feed(core, m.TrainGroup(epoch=0, version=1, seq=1, group=group(1, [4, 4])), "buffer")
    assert core.counters["train_rejected"] == 1 and [m.tag_of(x) for x in off] == ["credit"]
    out = feed(core, m.EpochComplete(epoch=0, groups=2), "buffer")
    assert core.learner.version == 0 and not any(isinstance(x, m.WeightsBegin) for x in out)  # 1 of 2 consumed
    feed(core, m.TrainGroup(epoch=0, version=0, seq=2, group=group(1, [2, 4])), "buffer")
    out = feed(core, m.EpochComplete(epoch=0, groups=2), "buffer")
    begin = next(x for x in out if isinstance(x, m.WeightsBegin))
    assert core.learner.version == 1 and begin.version == 1 and not any(isinstance(x, m.StepDone) for x in out)
    assert [(r["epoch"], r["version"], r["samples"]) for r in sink.rows] == [(0, 1, 4.0)]
    done = feed(core, m.WeightsStored(reply_to=begin.id, version=1), "publisher", now=0.5)
    assert [(x.epoch, x.version) for x in done if isinstance(x, m.StepDone)] == [(0, 1)]
    assert len(sink.rows) == 1


def test_trainer_reports_each_step_when_the_publishers_reply_comes_after_the_next_epoch() -> None:
    """The publisher's WeightsStored of v1 can reach the trainer after epoch 1 was trained (the buffer's
    and coordinator's messages come on other sockets and overtake it): each StepDone still names its
    own epoch and version. With one slot for the finished step, v1's reply took epoch 1's numbers and
    v2's found none: the coordinator never heard of v2 and the run stalled."""
    sink = MemorySink()
    core = trainer(sink)
    core.start(0.0)
    core.outbox.clear()
    begins = []
    for e in (0, 1):
        feed(core, m.EpochOpen(epoch=e, version=e, groups=1), "buffer")
        feed(core, m.TrainGroup(epoch=e, version=e, seq=0, group=group(e, [4, 1])), "buffer")
        out = feed(core, m.EpochComplete(epoch=e, groups=1), "buffer")
        begins.append(next(x for x in out if isinstance(x, m.WeightsBegin)))
    done = []
    for version, begin in ((1, begins[0]), (2, begins[1])):
        done += feed(core, m.WeightsStored(reply_to=begin.id, version=version), "publisher", now=0.5)
    assert [(x.epoch, x.version) for x in done if isinstance(x, m.StepDone)] == [(0, 1), (1, 2)]
    assert [(r["epoch"], r["version"]) for r in sink.rows] == [(0, 1), (1, 2)]


def test_trainer_resumes_from_the_sinks_latest_checkpoint(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    first = trainer(run)
    first.learner.step()
    first.learner.step()
    run.save_checkpoint(2, first.learner.save_checkpoint)
    again = trainer(run, resume=True)
    again.start(0.0)
    assert again.learner.version == 2 and again.version == 2
    assert np.array_equal(again.learner.theta, first.learner.theta)


# --- the publisher core ----------------------------------------------------------------------------


def upload(core: PublisherCore, version: int, sender: str = "trainer") -> list[m.Msg]:
    snap = Snapshot.from_tensors(version, {"w": np.full(3000, version, dtype=np.float32)})
    out: list[m.Msg] = []
    for part, payloads in transfer_messages(snap, 4096):
        part.sender = sender
        core.handle(0.0, Inbound(part, payloads, identity=sender.encode()))
        out += [x for _, x, _ in core.outbox]
        core.outbox.clear()
    return out


def test_publisher_stores_newer_versions_only_and_serves_the_current_one() -> None:
    core = PublisherCore("publisher", EventLog("publisher", "publisher"), 4096, 5.0)
    out = feed(core, m.FetchWeights(), "worker-0")
    assert isinstance(out[0], m.Error) and "no weights" in out[0].detail
    assert [m.tag_of(x) for x in upload(core, 1)] == ["weights_stored", "weights_available"]
    assert isinstance(upload(core, 1)[0], m.Error)  # not newer: refused
    core.handle(0.0, Inbound(m.FetchWeights(sender="worker-0"), [], peer="worker-0"))
    served, core.outbox = core.outbox, []
    begin, *chunks, end = [(x, p) for _, x, p in served]
    assert isinstance(begin[0], m.WeightsBegin) and begin[0].version == 1 and begin[0].chunks == 3
    asm = Assembler(begin[0], 0.0)
    for chunk, payloads in chunks:
        asm.chunk(chunk, list(payloads))  # type: ignore[arg-type]
    snap = asm.end(end[0])  # type: ignore[arg-type]
    assert np.frombuffer(snap.data, dtype=np.float32).tolist() == [1.0] * 3000


class QueueingLearner(SimLearner):
    """A learner that queues like GRPO's: accumulate defers the work to flush (or step)."""

    def __init__(self) -> None:
        cfg = load_config(None, {"worker.engine": "sim", "trainer.learner": "sim"})
        super().__init__(cfg.sim, cfg.run.seed)
        self.queue: list[m.Group] = []
        self.flushes: list[int] = []

    def accumulate(self, group: m.Group) -> dict[str, float]:
        self.queue.append(group)
        return {}

    def flush(self, max_groups: int | None = None) -> int:
        n = len(self.queue) if max_groups is None else min(len(self.queue), max(1, max_groups))
        for g in self.queue[:n]:
            super().accumulate(g)
        self.queue, self.flushes = self.queue[n:], [*self.flushes, n]
        return n

    @property
    def pending(self) -> int:
        return len(self.queue)


def test_trainer_trains_groups_that_arrived_together_in_one_flush() -> None:
    learner = QueueingLearner()
    core = TrainerCore("trainer", EventLog("trainer", "trainer"), learner, MemorySink(), 4, 1 << 20, 5.0)
    feed(core, m.EpochOpen(epoch=0, version=0, groups=4), "buffer")
    for gid in range(3):  # three groups in the inbox before the trainer gets to them
        feed(core, m.TrainGroup(epoch=0, version=0, seq=gid, group=group(gid, [4, 1])), "buffer")
    assert learner.pending == 3 and len(core.deferred) == 1  # one flush queued behind them
    core.deferred.pop()(0.1)
    assert learner.flushes == [3] and learner.pending == 0
    feed(core, m.TrainGroup(epoch=0, version=0, seq=3, group=group(3, [4, 4])), "buffer")
    assert not core.deferred and learner.pending == 1  # the epoch's last group: trained by the step


def test_trainer_waits_for_a_generated_epochs_rest_to_train_it_in_one_micro_batch() -> None:
    """Once the buffer says every group left is on its way, the trainer queues them all (no flush of
    the one that happened to arrive first) and the step trains them together."""
    learner = QueueingLearner()
    core = TrainerCore("trainer", EventLog("trainer", "trainer"), learner, MemorySink(), 4, 1 << 20, 5.0)
    feed(core, m.EpochOpen(epoch=0, version=0, groups=3), "buffer")
    feed(core, m.TrainGroup(epoch=0, version=0, seq=0, group=group(0, [4, 1]), generated=True), "buffer")
    assert not core.deferred and learner.pending == 1
    for gid in (1, 2):
        feed(core, m.TrainGroup(epoch=0, version=0, seq=gid, group=group(gid, [4, 1]), generated=True), "buffer")
    assert not core.deferred and learner.pending == 3 and learner.flushes == []


def test_trainer_paces_flushes_while_sharing_cores_so_the_last_group_boosts_at_once() -> None:
    """With a boost to come, a flush is cut to a slice (one group until the trainer has timed one) and
    the rest deferred behind the inbox: the epoch's last group is read (every core taken) between
    slices, and what is left is trained in one flush on every core."""
    learner, calls = QueueingLearner(), []
    plan = ThreadPlan(1, 2, calls.append)
    core = TrainerCore("trainer", EventLog("trainer", "trainer"), learner, MemorySink(), 8, 1 << 20, 5.0, threads=plan)
    feed(core, m.EpochOpen(epoch=0, version=0, groups=5), "buffer")
    for gid in range(4):
        feed(core, m.TrainGroup(epoch=0, version=0, seq=gid, group=group(gid, [4, 1])), "buffer")
    core.deferred.pop()(0.1)
    assert learner.flushes == [1] and learner.pending == 3 and len(core.deferred) == 1  # the rest: later
    assert core.schedule.group_s is not None
    feed(core, m.TrainGroup(epoch=0, version=0, seq=4, group=group(4, [4, 4])), "buffer")  # the last
    assert calls == [1, 2] and not plan.boost_pending
    core.deferred.pop()(0.2)
    assert learner.flushes == [1, 4] and learner.pending == 0 and not core.deferred


def test_trainer_takes_every_core_as_soon_as_the_buffer_holds_the_whole_epoch() -> None:
    """The whole epoch generated in one wave: the first group the buffer streams after that says so,
    and the trainer trains the rest on every core, not a slice on its share first."""
    learner, calls = QueueingLearner(), []
    core = TrainerCore(
        "trainer",
        EventLog("trainer", "trainer"),
        learner,
        MemorySink(),
        8,
        1 << 20,
        5.0,
        threads=ThreadPlan(1, 2, calls.append),
    )
    feed(core, m.EpochOpen(epoch=0, version=0, groups=3), "buffer")
    feed(core, m.TrainGroup(epoch=0, version=0, seq=0, group=group(0, [4, 1]), generated=True), "buffer")
    assert calls == [1, 2]
    feed(core, m.TrainGroup(epoch=0, version=0, seq=1, group=group(1, [4, 1])), "buffer")
    assert not core.deferred and learner.pending == 2  # no slice on the share first: all for the step


def test_trainer_takes_every_core_once_the_epochs_last_group_arrived() -> None:
    """threads auto under `up`: the trainer's share while workers generate, all cores from the
    epoch's last group on (the workers wait for weights then), the share again at the next epoch."""
    calls: list[int] = []
    plan = ThreadPlan(1, 2, calls.append)
    core = TrainerCore(
        "trainer", EventLog("trainer", "trainer"), sim_learner(), MemorySink(), 4, 1 << 20, 5.0, threads=plan
    )
    feed(core, m.EpochOpen(epoch=0, version=0, groups=3), "buffer")
    assert calls == [1]
    for gid in range(2):
        feed(core, m.TrainGroup(epoch=0, version=0, seq=gid, group=group(gid, [4, 1])), "buffer")
    feed(core, m.TrainGroup(epoch=0, version=1, seq=9, group=group(7, [4, 1])), "buffer")  # off-policy: not counted
    assert calls == [1]
    feed(core, m.TrainGroup(epoch=0, version=0, seq=2, group=group(2, [4, 1])), "buffer")
    assert calls == [1, 2]
    feed(core, m.EpochComplete(epoch=0, groups=3), "buffer")
    feed(core, m.EpochOpen(epoch=1, version=1, groups=3), "buffer")
    assert calls == [1, 2, 1]
