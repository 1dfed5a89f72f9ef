"""run.mode bounded on the pure cores (no sockets): the coordinator opens epoch e+1 before v_{e+1}
exists, hands its work to workers holding v_{e+1-k} .. v_{e+1} only, requeues a leaver's groups;
the buffer refuses (and counts) groups older than the bound."""

from __future__ import annotations

import dataclasses

from prl_actors.actors.buffer import BufferCore
from prl_actors.actors.coordinator import CoordinatorCore
from prl_actors.logs import EventLog
from prl_actors.protocol import messages as m
from tests.test_cores import KEY, B, G, coordinator, drive, inbound, open_epoch, request_work, result, send_group


def bounded(k: int, epochs: int = 4) -> CoordinatorCore:
    core = coordinator(epochs)
    core.s = dataclasses.replace(core.s, mode="bounded", max_staleness=k)
    return core


def generate(core: CoordinatorCore, epoch: int, version: int, worker: str = "worker-a") -> list:  # type: ignore[type-arg]
    """Every group of `epoch` assigned to and accepted from `worker` holding `version`; the outputs."""
    out = []
    for g in range(B):
        work = request_work(core, worker, version)
        assert isinstance(work, m.WorkAssign) and work.epoch == epoch and work.version == version
        out += drive(core, 0.2, m.GroupAccepted(epoch=epoch, version=version, group_id=g, worker=worker), "buffer")
    return out


def ack_open(core: CoordinatorCore, out: list) -> m.EpochOpen:  # type: ignore[type-arg]
    """The EpochOpen among `out`, acked by the buffer: the epoch runs and workers hear its floor."""
    (opened,) = [msg for _, msg in out if isinstance(msg, m.EpochOpen)]
    starts = drive(core, 0.3, m.Ack(reply_to=opened.id), "buffer")
    assert core.phase.current == m.Phase.RUNNING and core.epoch == opened.epoch
    floors = {msg.version for _, msg in starts if isinstance(msg, m.EpochStart)}
    assert floors == {max(0, opened.epoch - core.s.max_staleness)}  # workers are told the floor
    return opened


def opens(out: list) -> list[int]:  # type: ignore[type-arg]
    return [msg.epoch for _, msg in out if isinstance(msg, m.EpochOpen)]


def test_k1_opens_the_next_epoch_before_its_weights_and_bounds_the_work() -> None:
    core = bounded(1)
    open_epoch(core)
    opened = ack_open(core, generate(core, 0, 0))  # epoch 0 generated: epoch 1 opens with only v0 out
    assert (opened.epoch, opened.version, core.available_version) == (1, 1, 0)
    assert opens(generate(core, 1, 0)) == []  # v0 generates epoch 1 (staleness 1); epoch 2 needs v1
    assert core.phase.current == m.Phase.TRAINING
    assert opens(drive(core, 0.4, m.StepDone(epoch=0, version=1), "trainer")) == []  # not published yet
    opened = ack_open(core, drive(core, 0.4, m.WeightsAvailable(version=1), "publisher"))
    assert opened.epoch == 2
    stale = request_work(core, "worker-b", 0)  # v0 is two behind epoch 2
    assert isinstance(stale, m.NoWork) and stale.reason == "stale_version" and stale.version == 1
    work = request_work(core, "worker-b", 1)
    assert isinstance(work, m.WorkAssign) and work.version == 1 and work.epoch == 2
    drive(core, 0.5, m.Leave(reason="scale down"), "worker-b")  # its group goes back to the queue, first
    assert list(core.work.queue)[0] == work.prompts[0].group_id


def test_k2_lets_two_epochs_run_ahead_of_the_trainer() -> None:
    core = bounded(2)
    open_epoch(core)
    assert ack_open(core, generate(core, 0, 0)).epoch == 1
    assert ack_open(core, generate(core, 1, 0)).epoch == 2  # still only v0 published
    assert opens(generate(core, 2, 0)) == []  # epoch 3's floor is v1
    assert ack_open(core, drive(core, 0.4, m.WeightsAvailable(version=1), "publisher")).epoch == 3


def test_k0_waits_for_the_epochs_own_weights() -> None:
    core = bounded(0)
    open_epoch(core)
    assert opens(generate(core, 0, 0)) == []
    assert ack_open(core, drive(core, 0.4, m.WeightsAvailable(version=1), "publisher")).epoch == 1


def test_buffer_refuses_groups_older_than_the_bound() -> None:
    core = BufferCore("buffer", EventLog("buffer", "buffer"), "bounded", G, max_groups=100, max_staleness=1)
    core.handle(0.0, inbound(m.EpochOpen(epoch=2, version=2, groups=2, ticket_key=KEY), "coordinator", "coordinator"))
    core.handle(0.0, inbound(m.Credit(n=10), "trainer"))
    for version, ok in ((0, False), (3, False), (1, True), (2, True)):
        ack, out = send_group(core, result(2, version, 0 if version == 1 else 1))
        assert ack.accepted == ok, version
        if ok:
            (tg,) = [x for x in out if isinstance(x, m.TrainGroup)]
            assert tg.version == version  # the behaviour version travels with the group
    assert core.counters["rejected.stale_version"] == 2
