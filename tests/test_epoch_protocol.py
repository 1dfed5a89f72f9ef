"""The pure actor cores, driven without sockets: the epoch protocol's rules one by one."""

from __future__ import annotations

import numpy as np
import pytest

from prl_actors.buffer.core import BufferCore
from prl_actors.coordinator.core import CoordinatorCore, CoordinatorSettings
from prl_actors.engines.sim import SimEngine
from prl_actors.launch import build
from prl_actors.protocol import messages as m
from prl_actors.protocol import tickets
from prl_actors.records.logs import EventLog
from prl_actors.tasks.base import Task, exact_match
from prl_actors.transport.port import Inbound
from prl_actors.worker.core import WorkerCore

pytestmark = pytest.mark.fast

B, G = 4, 2
KEY = b"k" * 32  # the coordinator's ticket key, as the buffer learns it from EpochOpen


def inbound(msg: m.Msg, sender: str, peer: str | None = None) -> Inbound:
    msg.sender = sender
    return Inbound(msg, [], peer=peer, identity=b"" if peer else sender.encode())


def coordinator(epochs: int = 3) -> CoordinatorCore:
    settings = CoordinatorSettings(
        run_id="r",
        mode="periodic",
        epochs=epochs,
        groups_per_epoch=B,
        group_size=G,
        heartbeat_interval_s=0.1,
        heartbeat_timeout_s=1.0,
        max_groups_per_request=1,
        publisher_addr="p",
        buffer_addr="b",
    )
    task = Task(items=[(f"q{i}", str(i)) for i in range(10)], reward=exact_match)
    return CoordinatorCore("coordinator", EventLog("coordinator", "coordinator"), settings, task)


def drive(core, now: float, msg: m.Msg, sender: str) -> list[tuple[str, m.Msg]]:  # type: ignore[no-untyped-def]
    core.now = now
    core.handle(now, inbound(msg, sender))
    out, core.outbox = core.outbox, []
    return [(repr(d), msg) for d, msg, _ in out]


def open_epoch(core: CoordinatorCore, version: int = 0) -> None:
    for name, role in (("buffer", "buffer"), ("worker-a", "worker"), ("worker-b", "worker")):
        drive(core, 0.0, m.Register(role=m.Role(role)), name)
    out = drive(core, 0.0, m.WeightsAvailable(version=version), "publisher")
    (opened,) = [msg for _, msg in out if isinstance(msg, m.EpochOpen)]
    out = drive(core, 0.0, m.Ack(reply_to=opened.id), "buffer")
    assert core.phase.current == m.Phase.RUNNING
    assert sorted(d for d, msg in out if isinstance(msg, m.EpochStart)) == ["id:worker-a", "id:worker-b"]


def request_work(core: CoordinatorCore, worker: str, version: int, now: float = 0.1) -> m.Msg:
    (_, reply), *_ = drive(core, now, m.WorkRequest(version=version), worker)
    return reply


def test_epoch_opens_only_after_buffer_acks() -> None:
    core = coordinator()
    drive(core, 0.0, m.Register(role=m.Role.BUFFER), "buffer")
    out = drive(core, 0.0, m.WeightsAvailable(version=0), "publisher")
    assert any(isinstance(msg, m.EpochOpen) and msg.groups == B for _, msg in out)
    assert core.phase.current == m.Phase.OPENING
    drive(core, 0.0, m.Register(role=m.Role.WORKER), "worker-a")
    assert isinstance(request_work(core, "worker-a", 0), m.NoWork)


def test_work_only_for_the_epoch_version() -> None:
    core = coordinator()
    open_epoch(core)
    stale = request_work(core, "worker-a", version=-1)
    assert isinstance(stale, m.NoWork) and stale.reason == "stale_version"
    work = request_work(core, "worker-a", version=0)
    assert isinstance(work, m.WorkAssign) and work.version == 0 and work.epoch == 0
    assert [p.group_id for p in work.prompts] == [0]


def test_pull_hands_out_each_group_once_then_queue_empty() -> None:
    core = coordinator()
    open_epoch(core)
    got = [request_work(core, w, 0) for w in ("worker-a", "worker-b", "worker-a", "worker-b")]
    assert sorted(p.group_id for r in got for p in r.prompts) == list(range(B))  # type: ignore[attr-defined]
    empty = request_work(core, "worker-a", 0)
    assert isinstance(empty, m.NoWork) and empty.reason == "queue_empty"


def test_leaving_worker_groups_are_requeued_and_waiters_nudged() -> None:
    core = coordinator()
    open_epoch(core)
    for _ in range(2):
        request_work(core, "worker-a", 0)
    for _ in range(2):
        request_work(core, "worker-b", 0)
    request_work(core, "worker-b", 0)  # queue_empty: worker-b now waits for a nudge
    out = drive(core, 0.2, m.Leave(reason="scale down"), "worker-a")
    assert any(d == "id:worker-b" and isinstance(msg, m.EpochStart) for d, msg in out)
    again = request_work(core, "worker-b", 0)
    assert [p.group_id for p in again.prompts] == [0]  # type: ignore[attr-defined]


def test_silent_worker_times_out_and_done_groups_are_never_reassigned() -> None:
    core = coordinator()
    open_epoch(core)
    request_work(core, "worker-a", 0, now=0.0)  # group 0
    request_work(core, "worker-a", 0, now=0.0)  # group 1
    drive(core, 0.5, m.GroupAccepted(epoch=0, version=0, group_id=0, worker="worker-a"), "buffer")
    drive(core, 1.4, m.Heartbeat(version=0), "worker-b")
    drive(core, 1.4, m.Heartbeat(version=0), "buffer")
    core.now = 1.5
    core.tick(1.5)  # worker-a silent for 1.5 s > 1.0 s
    assert "worker-a" not in core.members
    assert list(core.work.queue) == [1, 2, 3]


def test_epoch_advances_on_new_weights_after_all_groups_accepted() -> None:
    core = coordinator(epochs=2)
    open_epoch(core)
    for g in range(B):
        request_work(core, "worker-a", 0)
        drive(core, 0.2, m.GroupAccepted(epoch=0, version=0, group_id=g, worker="worker-a"), "buffer")
    assert core.phase.current == m.Phase.TRAINING
    out = drive(core, 0.3, m.WeightsAvailable(version=1), "publisher")
    opened = [msg for _, msg in out if isinstance(msg, m.EpochOpen)]
    assert [msg.epoch for msg in opened] == [1]
    drive(core, 0.3, m.Ack(reply_to="stale"), "buffer")
    assert core.phase.current == m.Phase.OPENING  # only the ack of this epoch_open opens the epoch
    drive(core, 0.3, m.Ack(reply_to=opened[0].id), "buffer")
    assert core.phase.current == m.Phase.RUNNING and core.epoch == 1
    assert isinstance(request_work(core, "worker-a", 0), m.NoWork)  # still holds v0
    for g in range(B):
        request_work(core, "worker-a", 1)
        drive(core, 0.4, m.GroupAccepted(epoch=1, version=1, group_id=g, worker="worker-a"), "buffer")
    out = drive(core, 0.5, m.StepDone(epoch=1, version=2), "trainer")
    assert core.phase.current == m.Phase.DONE and core.stopped
    assert {d for d, msg in out if isinstance(msg, m.Shutdown)} >= {"id:worker-a", "id:buffer"}


def test_unknown_heartbeat_is_told_to_register() -> None:
    core = coordinator()
    ((_, ack),) = drive(core, 0.0, m.Heartbeat(version=0), "worker-ghost")
    assert isinstance(ack, m.HeartbeatAck) and not ack.known


def buffer(mode: str = "periodic") -> BufferCore:
    core = BufferCore("buffer", EventLog("buffer", "buffer"), mode, G, max_groups=100)
    core.handle(0.0, inbound(m.EpochOpen(epoch=0, version=0, groups=2, ticket_key=KEY), "coordinator", "coordinator"))
    core.handle(0.0, inbound(m.Credit(n=10), "trainer"))
    core.outbox.clear()
    return core


def result(epoch: int, version: int, gid: int, n: int = G, worker: str = "worker-w") -> m.GroupResult:
    samples = [m.Sample(text="1", token_ids=[1], logprobs=[0.0], reward=1.0)] * n
    group = m.Group(group_id=gid, prompt="p", prompt_ids=[1], samples=samples, worker=worker)
    return m.GroupResult(epoch=epoch, version=version, group=group, ticket=tickets.mint(KEY, epoch, gid, worker))


def send_group(core: BufferCore, msg: m.GroupResult) -> tuple[m.GroupAck, list[m.Msg]]:
    core.handle(0.0, inbound(msg, msg.group.worker))
    out, core.outbox = core.outbox, []
    acks = [x for _, x, _ in out if isinstance(x, m.GroupAck)]
    return acks[0], [x for _, x, _ in out if not isinstance(x, m.GroupAck)]


def test_buffer_rejects_stale_duplicate_wrong_epoch_unknown_and_bad_size() -> None:
    core = buffer()
    cases = [
        (result(0, 1, 0), "stale_version"),
        (result(1, 1, 0), "wrong_epoch"),
        (result(0, 0, 7), "unknown_group"),
        (result(0, 0, 0, n=G + 1), "bad_group_size"),
    ]
    for msg, reason in cases:
        ack, _ = send_group(core, msg)
        assert (ack.accepted, ack.reason) == (False, reason)
    ack, _ = send_group(core, result(0, 0, 0))
    assert ack.accepted
    ack, _ = send_group(core, result(0, 0, 0))
    assert (ack.accepted, ack.reason) == (False, "duplicate")
    assert core.counters["rejected.duplicate"] == 1 and core.counters["accepted"] == 1


def test_buffer_periodic_streams_on_arrival_sync_releases_the_batch() -> None:
    for mode, first_out in (("periodic", ["group_accepted", "train_group"]), ("sync", ["group_accepted"])):
        core = buffer(mode)
        _, out = send_group(core, result(0, 0, 1))
        assert [m.tag_of(x) for x in out] == first_out
        _, out = send_group(core, result(0, 0, 0))
        tags = [m.tag_of(x) for x in out]
        expected = ["train_group", "epoch_complete"] if mode == "periodic" else ["train_group"] * 2 + ["epoch_complete"]
        assert tags[1:] == expected
        assert [x.group.group_id for x in out if isinstance(x, m.TrainGroup)][-1] == 0


def test_buffer_respects_credits() -> None:
    core = BufferCore("buffer", EventLog("buffer", "buffer"), "periodic", G, max_groups=100)
    core.handle(0.0, inbound(m.EpochOpen(epoch=0, version=0, groups=2, ticket_key=KEY), "coordinator", "coordinator"))
    core.handle(0.0, inbound(m.Credit(n=1), "trainer"))
    send_group(core, result(0, 0, 0))
    _, out = send_group(core, result(0, 0, 1))
    assert not any(isinstance(x, m.TrainGroup) for x in out)  # no credit left
    core.handle(0.0, inbound(m.Credit(n=1), "trainer"))
    tags = [m.tag_of(x) for _, x, _ in core.outbox]
    assert tags == ["train_group", "epoch_complete"]


class FailingEngine:
    """An engine whose device went away: step raises."""

    version, max_rows, rows = 0, 8, 0
    busy = True

    def load_weights(self, version: int, tensors: object) -> None: ...

    def admit(self, prompts: list[m.Prompt], group_size: int) -> None: ...

    def step(self) -> list:  # type: ignore[type-arg]
        raise RuntimeError("device lost")

    def abort(self) -> list[int]:
        self.busy = False
        return []

    def close(self) -> None: ...


def worker(engine) -> WorkerCore:  # type: ignore[no-untyped-def]
    task = Task(items=[("ctx 1", "4")], reward=exact_match)
    core = WorkerCore("worker-x", EventLog("worker-x", "worker"), engine, task, G, 5.0, request_timeout_s=1.0)
    core.registered, core.target = True, 0
    return core


def assign(core: WorkerCore, now: float = 0.0) -> list[m.Msg]:
    core.now = now
    msg = m.WorkAssign(reply_to="r", epoch=0, version=0, prompts=[m.Prompt(group_id=2, prompt="ctx 1", answer="4")])
    core.handle(now, inbound(msg, "coordinator", peer="coordinator"))
    while core.deferred:  # what the host does: generation runs as a later inbox item
        fn = core.deferred.pop(0)
        fn(now)
    out, core.outbox = core.outbox, []
    return [x for _, x, _ in out]


def test_worker_resends_a_group_whose_ack_is_lost() -> None:
    engine = SimEngine(build.engine_settings(sim_config_for_cores()))
    engine.load_weights(0, {"theta": np.zeros((8, 8), dtype=np.float32)})
    core = worker(engine)
    first = [x for x in assign(core) if isinstance(x, m.GroupResult)]
    assert len(first) == 1
    core.now = 2.0
    core.tick(2.0)  # no GroupAck within request_timeout_s = 1 s
    again = [x for _, x, _ in core.outbox if isinstance(x, m.GroupResult)]
    assert len(again) == 1 and again[0].group == first[0].group and again[0].id != first[0].id


def test_worker_engine_failure_hands_groups_back() -> None:
    core = worker(FailingEngine())
    out = assign(core)
    # the next request went out before generating; the held groups are given back at once, with the cause
    assert [m.tag_of(x) for x in out] == ["work_request", "give_back"]
    back = out[-1]
    assert isinstance(back, m.GiveBack) and back.groups and "generate:" in back.error
    assert core.counters["generate_failed"] == 1 and core.registered


def sim_config_for_cores():  # type: ignore[no-untyped-def]
    from prl_actors.config import load_config

    return load_config(None, {"worker.engine": "sim", "trainer.learner": "sim", "sim.gen_s_per_token": 0.0})


def test_a_stalled_epoch_says_why() -> None:
    core = coordinator()
    open_epoch(core)
    drive(core, 0.0, m.Leave(), "worker-a")
    drive(core, 0.0, m.Leave(), "worker-b")
    for now in (1.0, 5.0, 12.0):
        drive(core, now, m.Heartbeat(version=0), "buffer")
        core.now = now
        core.tick(now)
    assert core.stall_reason == "no worker is registered"
    (_, status), *_ = drive(core, 12.0, m.StatusRequest(), "operator-cli")
    assert status.waiting_for == "no worker is registered"  # type: ignore[attr-defined]


def test_worker_asks_for_the_next_group_before_generating() -> None:
    engine = SimEngine(build.engine_settings(sim_config_for_cores()))
    engine.load_weights(0, {"theta": np.zeros((8, 8), dtype=np.float32)})
    core = worker(engine)
    core.now = 0.0
    msg = m.WorkAssign(reply_to="r", epoch=0, version=0, prompts=[m.Prompt(group_id=2, prompt="ctx 1", answer="4")])
    core.handle(0.0, inbound(msg, "coordinator", peer="coordinator"))
    assert [m.tag_of(x) for _, x, _ in core.outbox] == ["work_request"]  # flushed first
    assert len(core.deferred) == 1 and core.stepping  # generation is the next inbox item


def test_worker_sends_one_fetch_and_a_late_snapshot_drops_nothing() -> None:
    """While a FetchWeights is out, other inputs (a NoWork, a heartbeat ack) send no second one; a
    snapshot no newer than the engine's (the answer to an earlier fetch) swaps nothing and leaves the
    running batch alone (dropping it would strand groups the coordinator believes are generating)."""
    from prl_actors.weights.transfer import Snapshot, transfer_messages

    engine = SimEngine(build.engine_settings(sim_config_for_cores()))
    engine.load_weights(0, {"theta": np.zeros((8, 8), dtype=np.float32)})
    core = worker(engine)
    core.now = 0.0
    core.handle(0.0, inbound(m.EpochStart(epoch=1, version=1, groups=1), "coordinator", peer="coordinator"))
    core.handle(0.0, inbound(m.NoWork(reply_to="r", reason=m.NoWorkReason.NO_EPOCH), "coordinator", peer="coordinator"))
    core.handle(0.0, inbound(m.HeartbeatAck(reply_to="h", known=True, version=1), "coordinator", peer="coordinator"))
    fetches = [x for _, x, _ in core.outbox if isinstance(x, m.FetchWeights)]
    assert len(fetches) == 1
    core.outbox.clear()
    snap = Snapshot.from_tensors(1, {"theta": np.ones((8, 8), dtype=np.float32)})
    for _ in range(2):  # the answer, then a duplicate of it
        for part, payloads in transfer_messages(snap, 1 << 20, epoch=1):
            core.handle(0.0, m_inbound(part, payloads))
        if engine.version == 1 and not engine.busy:
            msg = m.WorkAssign(reply_to="r", epoch=1, version=1, prompts=[m.Prompt(group_id=5, prompt="c", answer="4")])
            core.handle(0.0, inbound(msg, "coordinator", peer="coordinator"))
    assert engine.version == 1 and engine.busy and 5 in core.assigned  # still generating group 5
    assert core.counters.get("groups_dropped", 0) == 0


def m_inbound(msg: m.Msg, payloads: list) -> Inbound:  # type: ignore[type-arg]
    msg.sender = "publisher"
    return Inbound(msg, payloads, peer="publisher")


def test_worker_takes_every_core_for_a_new_epoch_until_its_first_group_is_sent() -> None:
    """threads auto with one local worker: the new weights give it every core (the trainer has
    nothing to train yet); its first finished group gives the trainer its share back."""
    from prl_actors.runtime.threads import ThreadPlan
    from prl_actors.weights.transfer import Snapshot, transfer_messages

    engine = SimEngine(build.engine_settings(sim_config_for_cores()))
    calls: list[int] = []
    core = worker(engine)
    core.threads = ThreadPlan(1, 2, calls.append)
    core.now = 0.0
    core.handle(0.0, inbound(m.EpochStart(epoch=0, version=0, groups=1), "coordinator", peer="coordinator"))
    assert calls == []  # no weights yet
    snap = Snapshot.from_tensors(0, {"theta": np.zeros((8, 8), dtype=np.float32)})
    for part, payloads in transfer_messages(snap, 1 << 20, epoch=0):
        core.handle(0.0, m_inbound(part, payloads))
    assert engine.version == 0 and calls == [2]
    sent = [x for x in assign(core) if isinstance(x, m.GroupResult)]
    assert len(sent) == 1 and calls == [2, 1]


def test_buffer_says_the_epoch_is_generated_once_every_group_is_in_or_announced() -> None:
    """A group streamed when the epoch's last group is accepted, or announced by the burst it came in
    (GroupResult.follows), tells the trainer that generation is over (it then takes every core)."""
    one_by_one = buffer()
    _, out = send_group(one_by_one, result(0, 0, 1))
    _, out2 = send_group(one_by_one, result(0, 0, 0))
    flags = [x.generated for x in out + out2 if isinstance(x, m.TrainGroup)]
    assert flags == [False, True]
    announced = buffer()  # the worker says one more group of its burst follows: the last one of the epoch
    first = result(0, 0, 1)
    first.follows = 1
    _, out = send_group(announced, first)
    assert [x.generated for x in out if isinstance(x, m.TrainGroup)] == [True]
