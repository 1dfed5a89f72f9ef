"""The weight-fetch state machine (weights/fetch.py) driven directly, then through the two cores
that use it (worker, env actor): request, chunks, failures and their retry, the deadline, a newer
version wanted mid-fetch."""

from __future__ import annotations

import numpy as np
import pytest

from prl_actors.classic.env_actor import EnvActorSettings, EnvCore
from prl_actors.classic.envkit.local import SlotEnvs
from prl_actors.config import load_config
from prl_actors.engines.sim import SimEngine
from prl_actors.launch import build
from prl_actors.protocol import messages as m
from prl_actors.protocol.codec import Frame
from prl_actors.records.logs import EventLog
from prl_actors.tasks.base import Task, exact_match
from prl_actors.transport.port import Inbound
from prl_actors.weights.fetch import RETRY_S, FetchingCore, WeightFetch
from prl_actors.weights.transfer import Snapshot, transfer_messages
from prl_actors.worker.core import WorkerCore

pytestmark = pytest.mark.fast

TIMEOUT = 30.0


Chunks = list[tuple[m.WeightChunk, list[Frame]]]


def parts(version: int, chunk_bytes: int = 64) -> tuple[m.WeightsBegin, Chunks, m.WeightsEnd]:
    """The transfer of a v`version` snapshot (256 bytes): begin, 4 chunks with their payloads, end."""
    snap = Snapshot.from_tensors(version, {"theta": np.full((8, 8), version, dtype=np.float32)})
    (begin, _), *chunks, (end, _) = transfer_messages(snap, chunk_bytes)
    return begin, chunks, end


def test_a_requested_fetch_assembles_its_chunks_and_stays_busy_until_cleared() -> None:
    fetch = WeightFetch(TIMEOUT)
    assert not fetch.busy
    fetch.request(1.0)
    assert fetch.busy and fetch.started == 1.0
    begin, chunks, end = parts(3)
    assert fetch.begin(1.5, begin) is None and fetch.started == 1.5
    for chunk, payloads in chunks:
        assert fetch.chunk(1.6, chunk, payloads) is None
    snap = fetch.end(1.7, end)
    assert isinstance(snap, Snapshot) and snap.version == 3 and snap.nbytes == 8 * 8 * 4
    assert fetch.busy  # until the actor installed it
    fetch.clear()
    assert not fetch.busy and not fetch.due(99.0)


def test_stray_chunks_and_ends_without_a_transfer_are_ignored() -> None:
    fetch = WeightFetch(TIMEOUT)
    _, [(chunk, payloads), *_], end = parts(1)
    assert fetch.chunk(0.0, chunk, payloads) is None and fetch.end(0.0, end) is None and not fetch.busy


def test_a_broken_chunk_fails_the_fetch_and_a_retry_is_due_once_after_retry_s() -> None:
    fetch = WeightFetch(TIMEOUT)
    fetch.request(0.0)
    begin, [(chunk, payloads), *_], _ = parts(2)
    fetch.begin(0.0, begin)
    why = fetch.chunk(1.0, chunk, [bytes(len(payloads[0]) + 1)])
    assert why is not None and "payload size" in why
    assert not fetch.busy
    assert not fetch.due(1.0 + RETRY_S / 2)
    assert fetch.due(1.0 + RETRY_S) and not fetch.due(1.0 + RETRY_S)  # due once
    fetch.request(1.0 + RETRY_S)
    assert fetch.busy


def test_a_transfer_that_ends_with_chunks_missing_fails() -> None:
    fetch = WeightFetch(TIMEOUT)
    fetch.request(0.0)
    begin, [_, *chunks], end = parts(2)
    fetch.begin(0.0, begin)
    for chunk, payloads in chunks:
        fetch.chunk(0.0, chunk, payloads)
    why = fetch.end(0.5, end)
    assert isinstance(why, str) and "missing" in why
    assert not fetch.busy and fetch.due(0.5 + RETRY_S)


def test_an_invalid_begin_fails_at_once() -> None:
    fetch = WeightFetch(TIMEOUT)
    fetch.request(0.0)
    begin, _, _ = parts(1)
    begin.total_bytes += 1
    assert "total_bytes" in (fetch.begin(0.0, begin) or "")
    assert not fetch.busy


def test_no_answer_within_the_timeout_fails_then_retries() -> None:
    fetch = WeightFetch(TIMEOUT)
    fetch.request(10.0)
    assert fetch.expired(10.0 + TIMEOUT) is None and fetch.busy
    assert fetch.expired(10.1 + TIMEOUT) == f"no complete transfer in {TIMEOUT}s"
    assert not fetch.busy and fetch.expired(100.0) is None  # failed once
    assert fetch.due(10.1 + TIMEOUT + RETRY_S)


def test_the_deadline_runs_from_weights_begin_while_chunks_arrive() -> None:
    fetch = WeightFetch(TIMEOUT)
    fetch.request(0.0)
    begin, _, _ = parts(1)
    fetch.begin(20.0, begin)
    assert fetch.expired(20.0 + TIMEOUT) is None and fetch.busy  # 50 s after the request: still in time
    assert fetch.expired(20.1 + TIMEOUT) is not None and not fetch.busy


def test_an_error_answers_only_a_fetch_still_waiting_for_its_begin() -> None:
    fetch = WeightFetch(TIMEOUT)
    assert not fetch.refused(0.0)  # none out
    fetch.request(0.0)
    begin, _, _ = parts(1)
    fetch.begin(0.1, begin)
    assert not fetch.refused(0.2) and fetch.busy  # the transfer goes on
    fetch.clear()
    fetch.request(1.0)
    assert fetch.refused(1.0) and not fetch.busy and fetch.due(1.0 + RETRY_S)


def test_a_newer_begin_replaces_the_transfer_still_arriving() -> None:
    fetch = WeightFetch(TIMEOUT)
    fetch.request(0.0)
    old_begin, [(old_chunk, old_payloads), *_], _ = parts(1)
    begin, chunks, end = parts(2)
    fetch.begin(0.0, old_begin)
    fetch.begin(0.1, begin)
    assert fetch.chunk(0.1, old_chunk, old_payloads) is not None  # a chunk of the replaced transfer
    fetch.request(0.2)
    fetch.begin(0.2, begin)
    for chunk, payloads in chunks:
        fetch.chunk(0.2, chunk, payloads)
    snap = fetch.end(0.3, end)
    assert isinstance(snap, Snapshot) and snap.version == 2


# --- through a worker core ------------------------------------------------------------------------


def worker() -> WorkerCore:
    settings = {"worker.engine": "sim", "trainer.learner": "sim", "sim.gen_s_per_token": 0.0}
    engine = SimEngine(build.engine_settings(load_config(None, settings)))
    engine.load_weights(0, {"theta": np.zeros((8, 8), dtype=np.float32)})
    task = Task(items=[("ctx 1", "4")], reward=exact_match)
    core = WorkerCore("worker-x", EventLog("worker-x", "worker"), engine, task, 2, TIMEOUT, request_timeout_s=1.0)
    core.registered, core.target, core.now = True, 0, 0.0
    return core


def handle(core: FetchingCore, now: float, msg: m.Msg, payloads: list, sender: str) -> list[m.Msg]:  # type: ignore[type-arg]
    msg.sender = sender
    core.now = now
    core.handle(now, Inbound(msg, payloads, peer=sender))
    return sent(core)


def sent(core: FetchingCore) -> list[m.Msg]:
    out, core.outbox = core.outbox, []
    return [x for _, x, _ in out]


def fetches(out: list[m.Msg]) -> list[m.FetchWeights]:
    return [x for x in out if isinstance(x, m.FetchWeights)]


def test_a_worker_told_of_a_newer_version_mid_fetch_fetches_again_once_the_first_is_loaded() -> None:
    core = worker()
    assert len(fetches(handle(core, 0.0, m.EpochStart(epoch=1, version=1, groups=1), [], "coordinator"))) == 1
    begin, chunks, end = parts(1)
    handle(core, 0.1, begin, [], "publisher")
    assert not fetches(handle(core, 0.2, m.EpochStart(epoch=2, version=2, groups=1), [], "coordinator"))
    for chunk, payloads in chunks:
        handle(core, 0.3, chunk, payloads, "publisher")
    again = fetches(handle(core, 0.4, end, [], "publisher"))
    assert core.engine.version == 1 and [f.version for f in again] == [1]  # it holds v1 and asks for more


def test_a_worker_whose_fetch_is_never_answered_logs_it_and_asks_again_after_retry_s() -> None:
    core = worker()
    handle(core, 0.0, m.EpochStart(epoch=1, version=1, groups=1), [], "coordinator")
    core.tick(TIMEOUT + 0.1)
    assert core.counters["weight_sync_failed"] == 1 and not fetches(sent(core))
    core.tick(TIMEOUT + 0.1 + RETRY_S)
    assert len(fetches(sent(core))) == 1


# --- through an env actor's core -------------------------------------------------------------------


class FakePolicy:
    """What EnvCore asks of its acting policy while it fetches: the version held, and a load."""

    def __init__(self) -> None:
        self.version = -1

    def load(self, version: int, tensors: object) -> None:
        self.version = version


def env_core(want: int) -> EnvCore:
    core = EnvCore("env-0", EventLog("env-0", "env"), SlotEnvs(), EnvActorSettings(fetch_timeout_s=TIMEOUT))
    core.policy, core.act_round, core.want_version, core.now = FakePolicy(), 0, want, 0.0
    return core


def test_an_env_actor_retries_a_broken_transfer_and_fetches_a_newer_version_wanted_mid_fetch() -> None:
    core = env_core(want=1)
    core._next()
    assert [f.version for f in fetches(sent(core))] == [-1]
    begin, [(chunk, payloads), *_], _ = parts(1)
    handle(core, 0.1, begin, [], "learner")
    handle(core, 0.1, chunk, [bytes(len(payloads[0]) + 1)], "learner")
    assert core.counters["weight_sync_failed"] == 1 and not core.fetch.busy
    core.tick(0.1 + RETRY_S / 2)
    assert not fetches(sent(core))
    core.tick(0.1 + RETRY_S)
    assert len(fetches(sent(core))) == 1
    begin, chunks, end = parts(1)
    handle(core, 0.4, begin, [], "learner")
    core.want_version = 2  # as a PolicyLogits whose KL asks for v2 would set it
    for chunk, payloads in chunks:
        handle(core, 0.5, chunk, payloads, "learner")
    again = fetches(handle(core, 0.6, end, [], "learner"))
    assert core.policy.version == 1 and [f.version for f in again] == [1]


def test_an_env_actor_whose_fetch_is_not_answered_in_time_asks_again() -> None:
    core = env_core(want=1)
    core._next()
    sent(core)
    core.tick(TIMEOUT)
    assert not core.counters.get("weight_sync_failed") and core.fetch.busy
    core.tick(TIMEOUT + 0.1)
    assert core.counters["weight_sync_failed"] == 1 and not fetches(sent(core))
    core.tick(TIMEOUT + 0.1 + RETRY_S)
    assert len(fetches(sent(core))) == 1
