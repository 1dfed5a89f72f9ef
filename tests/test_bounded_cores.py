"""run.mode bounded on the pure cores (no sockets): the coordinator opens epoch e+1 before v_{e+1}
exists, hands its work to workers holding v_{e+1-k} .. v_{e+1} only, requeues a leaver's groups;
an evaluated epoch pauses the pipeline (opens at v_e, generated and evaluated with v_e only);
the buffer refuses (and counts) groups older than the bound."""

from __future__ import annotations

import dataclasses

from prl_actors.buffer.core import BufferCore
from prl_actors.coordinator.core import CoordinatorCore
from prl_actors.coordinator.evaluation import EvalPlan, MemoryEvalSink
from prl_actors.protocol import messages as m
from prl_actors.records.logs import EventLog
from tests.test_epoch_protocol import (
    KEY,
    B,
    G,
    coordinator,
    drive,
    inbound,
    open_epoch,
    request_work,
    result,
    send_group,
)


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


def ack_open(core: CoordinatorCore, out: list, floor: int | None = None) -> m.EpochOpen:  # type: ignore[type-arg]
    """The EpochOpen among `out`, acked by the buffer: the epoch runs and workers hear its floor
    (v_{e-k} unless `floor` says otherwise)."""
    (opened,) = [msg for _, msg in out if isinstance(msg, m.EpochOpen)]
    starts = drive(core, 0.3, m.Ack(reply_to=opened.id), "buffer")
    assert core.phase.current == m.Phase.RUNNING and core.epoch == opened.epoch
    floors = {msg.version for _, msg in starts if isinstance(msg, m.EpochStart)}
    want = max(0, opened.epoch - core.s.max_staleness) if floor is None else floor
    assert floors == {want}  # workers are told the floor
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


def evaluate(core: CoordinatorCore, version: int, worker: str = "worker-b") -> list:  # type: ignore[type-arg]
    """A worker holding `version` asks with an idle engine: all eval prompts of v_version, answered."""
    (_, ev), *_ = drive(core, 0.5, m.WorkRequest(version=version, eval_ok=True, max_groups=8), worker)
    assert isinstance(ev, m.EvalAssign) and (ev.epoch, ev.version) == (version, version), ev
    groups = [
        m.EvalGroup(prompt_id=p.group_id, prompt=p.prompt, answer=p.answer, completions=["x"], rewards=[1.0])
        for p in ev.prompts
    ]
    return drive(core, 0.6, m.EvalResult(epoch=ev.epoch, version=ev.version, groups=groups), worker)


def test_k1_pauses_at_an_evaluated_epoch_so_its_weights_are_evaluated_by_themselves() -> None:
    core = bounded(1, epochs=4)
    sink = MemoryEvalSink()
    core.eval_plan, core.eval_sink = EvalPlan([("e0", "0", -1)], samples=1, every_epochs=2), sink
    open_epoch(core)
    assert opens(generate(core, 0, 0)) == []  # v0 is evaluated: epoch 1 waits, though v0 is its floor
    (_, stale), *_ = drive(core, 0.5, m.WorkRequest(version=1, eval_ok=True), "worker-b")  # not v0: no eval
    assert not isinstance(stale, m.EvalAssign)
    assert ack_open(core, evaluate(core, 0)).epoch == 1  # evaluated: the pipeline runs on (floor v0)
    assert opens(generate(core, 1, 0)) == []  # epoch 2 is evaluated: it waits for v2, not its k = 1 floor v1
    drive(core, 0.7, m.StepDone(epoch=0, version=1), "trainer")
    assert opens(drive(core, 0.7, m.WeightsAvailable(version=1), "publisher")) == []
    drive(core, 0.8, m.StepDone(epoch=1, version=2), "trainer")
    opened = ack_open(core, drive(core, 0.8, m.WeightsAvailable(version=2), "publisher"), floor=2)
    assert opened.epoch == 2
    stale = request_work(core, "worker-a", 1)  # within k of epoch 2, but epoch 2 is generated with v2 only
    assert isinstance(stale, m.NoWork) and stale.reason == "stale_version" and stale.version == 2
    assert opens(generate(core, 2, 2)) == []  # generated; epoch 3 waits for the evaluation of v2
    drive(core, 0.9, m.StepDone(epoch=2, version=3), "trainer")
    assert opens(drive(core, 0.9, m.WeightsAvailable(version=3), "publisher")) == []
    (_, ack), *_ = drive(core, 0.9, m.Heartbeat(version=2), "worker-b")
    assert isinstance(ack, m.HeartbeatAck) and ack.newest == 2  # no drift pull past v2 while it is evaluated
    assert ack_open(core, evaluate(core, 2)).epoch == 3  # evaluated: epoch 3 opens at its k = 1 floor v2
    assert [(e, v) for e, v, _, _ in sink.results] == [(0, 0), (2, 2)]


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
