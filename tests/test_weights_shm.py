"""Same-host weights through /dev/shm: one file per version and host, handed only to a worker that
proves it shares the host, and never trusted by the worker (path, owner, mode, size); anything
refused falls back to chunks. Cores are driven without sockets; one LocalCluster run end to end."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from prl_actors.launch.process import LocalCluster
from prl_actors.protocol import messages as m
from prl_actors.publisher.core import PublisherCore
from prl_actors.records.logs import EventLog
from prl_actors.tasks.base import Task, exact_match
from prl_actors.trainer.core import TrainerCore
from prl_actors.transport.port import Inbound
from prl_actors.weights.shm import (
    ShmPublisher,
    ShmReader,
    ShmRefused,
    ShmUnavailable,
    host_file,
    owner_file,
    reap_stale,
    snapshot_file,
)
from prl_actors.weights.transfer import Snapshot, transfer_messages
from prl_actors.worker.core import WorkerCore
from tests.conftest import read_logs, sim_config

RUN = "run-1"


def snap(version: int = 1) -> Snapshot:
    return Snapshot.from_tensors(version, {"a": np.arange(6, dtype=np.float32) + version, "b": np.ones(3, np.int64)})


def begin_for(path: str, s: Snapshot, **change: object) -> m.WeightsBegin:
    fields: dict[str, object] = {"version": s.version, "tensors": s.metas, "total_bytes": s.nbytes, "chunks": 0}
    return m.WeightsBegin(**{**fields, **change}, shm_path=path)  # type: ignore[arg-type]


@pytest.fixture
def published(tmp_path: Path) -> tuple[ShmPublisher, ShmReader, Snapshot]:
    pub, s = ShmPublisher(tmp_path), snap()
    pub.open_run(RUN)
    pub.publish(s.version, s.data)
    return pub, ShmReader(tmp_path), s


def test_a_worker_on_the_host_proves_it_and_reads_the_snapshot(published) -> None:
    pub, reader, s = published
    proof = reader.proof(RUN)
    assert len(proof) == 64 and pub.proves(proof)
    assert not pub.proves("0" * 64) and not pub.proves("")
    assert reader.proof("another-run") == ""  # no such host file: not this run's host
    view = reader.open(RUN, begin_for(pub.path(1), s))
    assert bytes(view) == bytes(s.data)
    view[:4] = b"\xff" * 4  # copy-on-write: the worker's writes never reach the shared file
    assert Path(pub.path(1)).read_bytes() == bytes(s.data)
    assert oct(os.stat(pub.path(1)).st_mode & 0o777) == "0o600"
    assert oct(os.stat(host_file(reader.root, RUN)).st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "{root}/../etc/passwd", "{root}/prl-0000000000000000-v1.weights", "{other_version}", ""],
    ids=["outside", "traversal", "another-run", "another-version", "empty"],
)
def test_a_path_from_the_network_is_only_ever_this_runs_own(published, path: str) -> None:
    pub, reader, s = published
    other = snapshot_file(reader.root, RUN, 2)
    other.write_bytes(bytes(s.data))
    with pytest.raises(ShmRefused, match="is not this run's file"):
        reader.open(RUN, begin_for(path.format(root=reader.root, other_version=other), s))


def test_a_file_of_the_wrong_size_kind_or_mode_is_refused(published, tmp_path: Path) -> None:
    pub, reader, s = published
    path = Path(pub.path(1))
    with pytest.raises(ShmRefused, match="does not match the tensor table"):
        reader.open(RUN, begin_for(str(path), s, total_bytes=s.nbytes + 4))
    with pytest.raises(ShmRefused, match="chunks follow"):
        reader.open(RUN, begin_for(str(path), s, chunks=1))
    path.write_bytes(bytes(s.data)[:-1])  # truncated
    with pytest.raises(ShmRefused, match="bytes, 48 were announced"):
        reader.open(RUN, begin_for(str(path), s))
    path.write_bytes(bytes(s.data))
    path.chmod(0o666)  # anyone on the host could have changed it
    with pytest.raises(ShmRefused, match="writable only by it"):
        reader.open(RUN, begin_for(str(path), s))
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")  # O_NOFOLLOW: a planted link is not followed
    (tmp_path / "elsewhere").write_bytes(bytes(s.data))
    with pytest.raises(ShmRefused, match="cannot map"):
        reader.open(RUN, begin_for(str(path), s))


def test_a_host_file_that_is_not_a_token_proves_nothing(tmp_path: Path) -> None:
    host_file(tmp_path, RUN).write_bytes(b"../" * 21 + b"x")
    os.chmod(host_file(tmp_path, RUN), 0o600)
    assert ShmReader(tmp_path).proof(RUN) == ""


def test_one_file_per_version_and_host_readers_keep_theirs(tmp_path: Path) -> None:
    pub, reader = ShmPublisher(tmp_path), ShmReader(tmp_path)
    pub.open_run(RUN)
    s1, s2 = snap(1), snap(2)
    mapped = pub.publish(1, s1.data)
    assert bytes(mapped) == bytes(s1.data)  # the publisher serves chunks from this mapping
    held = reader.open(RUN, begin_for(pub.path(1), s1))
    pub.publish(2, s2.data)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [host_file(tmp_path, RUN).name, owner_file(tmp_path, RUN).name, snapshot_file(tmp_path, RUN, 2).name]
    )
    assert bytes(held) == bytes(s1.data)  # unlinked, still intact for the worker that maps it
    pub.close()
    assert list(tmp_path.iterdir()) == []


def test_the_files_of_a_killed_publisher_are_removed_by_the_next(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs
    namespace = os.readlink("/proc/self/ns/pid")
    for run, owner in (("dead", f"{namespace} {gone.pid}"), ("alive", f"{namespace} {os.getpid()}"),
                       ("elsewhere", f"pid:[1] {gone.pid}")):  # fmt: skip
        owner_file(tmp_path, run).write_text(owner)
        snapshot_file(tmp_path, run, 3).write_bytes(b"x")
        host_file(tmp_path, run).write_bytes(b"0" * 64)
    ShmPublisher(tmp_path).open_run(RUN)  # a new publisher on this host
    left = {p.name for p in tmp_path.iterdir()}
    assert not any(p.name in left for p in (owner_file(tmp_path, "dead"), snapshot_file(tmp_path, "dead", 3)))
    assert host_file(tmp_path, "dead").name not in left
    for run in ("alive", "elsewhere"):  # a live publisher, or one in another pid namespace: not ours to judge
        assert snapshot_file(tmp_path, run, 3).name in left and owner_file(tmp_path, run).name in left
    assert reap_stale(tmp_path) == []


def test_no_space_or_no_run_means_no_shared_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pub = ShmPublisher(tmp_path)
    with pytest.raises(ShmUnavailable, match="no run id"):
        pub.publish(1, snap().data)
    pub.open_run(RUN)
    monkeypatch.setattr("prl_actors.weights.shm._free_bytes", lambda root: 1024)
    with pytest.raises(ShmUnavailable, match="MiB free"):
        pub.publish(1, snap().data)
    assert pub.path(1) == ""


# --- the cores -----------------------------------------------------------------------------------


class Engine:
    """Holds what it loads; never generates (an engine that is never busy)."""

    version = -1
    loaded: dict[str, np.ndarray] = {}
    max_rows, rows, busy = 1, 0, False

    def admit(self, prompts: list[m.Prompt], group_size: int) -> None: ...

    def step(self) -> list:  # type: ignore[type-arg]
        return []

    def abort(self) -> list[int]:
        return []

    def load_weights(self, version: int, tensors: dict[str, np.ndarray]) -> None:
        self.version, self.loaded = version, {k: np.array(v) for k, v in tensors.items()}

    def generate(self, prompts: list[m.Prompt], group_size: int) -> list:  # type: ignore[type-arg]
        return []

    def close(self) -> None: ...


def inbound(msg: m.Msg, sender: str, peer: str | None = None) -> Inbound:
    msg.sender = sender
    return Inbound(msg, [], peer=peer, identity=b"" if peer else sender.encode())


def publisher_with(tmp_path: Path, s: Snapshot) -> PublisherCore:
    core = PublisherCore("publisher", EventLog("publisher", "publisher"), 16, 5.0, ShmPublisher(tmp_path))
    welcome = m.Welcome(
        reply_to="", run_id=RUN, mode="periodic", group_size=2, groups_per_epoch=2, heartbeat_interval_s=1.0,
        publisher_addr="", buffer_addr="",
    )  # fmt: skip
    core.handle(0.0, inbound(welcome, "coordinator", peer="coordinator"))
    for part, payloads in transfer_messages(s, 16):
        part.sender = "trainer"  # the name the trainer's key covers (a role-bound message)
        core.handle(0.0, Inbound(part, list(payloads), peer=None, identity=b"trainer"))
    core.outbox = []
    return core


def fetch(core: PublisherCore, proof: str) -> list[tuple[m.Msg, list]]:  # type: ignore[type-arg]
    core.handle(0.0, inbound(m.FetchWeights(version=-1, host_proof=proof), "worker-x"))
    out, core.outbox = core.outbox, []
    return [(msg, list(p)) for _, msg, p in out]


def test_the_publisher_names_the_file_only_for_a_proven_worker(tmp_path: Path) -> None:
    s = snap()
    core = publisher_with(tmp_path, s)
    proven = fetch(core, ShmReader(tmp_path).proof(RUN))
    assert [m.tag_of(x) for x, _ in proven] == ["weights_begin", "weights_end"]
    assert proven[0][0].shm_path == str(snapshot_file(tmp_path, RUN, 1)) and proven[0][0].chunks == 0
    for claim in ("", "f" * 64, "hostname-of-the-publisher"):  # remote, guessing, claiming
        chunked = fetch(core, claim)
        assert [m.tag_of(x) for x, _ in chunked].count("weight_chunk") == -(-s.nbytes // 16)
        assert all(x.shm_path == "" for x, _ in chunked if isinstance(x, m.WeightsBegin))
    assert core.counters["shm_proof_refused"] == 2
    core.close()
    assert list(tmp_path.iterdir()) == []


def worker_with(tmp_path: Path) -> tuple[WorkerCore, Engine]:
    engine = Engine()
    task = Task(items=[("q", "a")], reward=exact_match)
    core = WorkerCore("worker-x", EventLog("worker-x", "worker"), engine, task, 2, 5.0, 1.0, as_torch=False)
    core.shm, core.run_id = ShmReader(tmp_path), RUN
    core.registered, core.target = True, 1
    return core, engine


def to_worker(core: WorkerCore, replies: list[tuple[m.Msg, list]], now: float = 0.0) -> None:  # type: ignore[type-arg]
    for msg, payloads in replies:
        core.now = now
        core.handle(now, Inbound(msg, payloads, peer="publisher", identity=b""))


def test_a_worker_loads_from_shared_memory_and_falls_back_to_chunks_when_refused(tmp_path: Path) -> None:
    s = snap()
    pub = publisher_with(tmp_path, s)
    core, engine = worker_with(tmp_path)
    core._next()
    (req,) = [x for _, x, _ in core.outbox]
    assert isinstance(req, m.FetchWeights) and pub.shm is not None and pub.shm.proves(req.host_proof)
    core.outbox = []
    to_worker(core, fetch(pub, req.host_proof))
    assert engine.version == 1 and engine.loaded["a"].tolist() == list(np.arange(6) + 1.0)

    os.chmod(snapshot_file(tmp_path, RUN, 1), 0o644 | 0o020)  # tampered with: group-writable
    core, engine = worker_with(tmp_path)  # a worker that joins now
    core._next()
    core.outbox = []
    to_worker(core, fetch(pub, ShmReader(tmp_path).proof(RUN)))
    assert engine.version == -1 and core.counters["shm_refused"] == 1 and core.shm is None
    core.tick(0.5)  # the retry: a fetch without proof, answered with chunks
    (again,) = [x for _, x, _ in core.outbox]
    assert isinstance(again, m.FetchWeights) and again.host_proof == ""
    to_worker(core, fetch(pub, again.host_proof), now=0.5)
    assert engine.version == 1 and engine.loaded["b"].tolist() == [1, 1, 1]


@pytest.mark.parametrize("worker_shm", [True, False], ids=["shm", "chunks-from-the-mapping"])
def test_a_local_run_serves_same_host_workers_from_shared_memory(tmp_path: Path, worker_shm: bool) -> None:
    """With worker.shm off the workers prove nothing and get chunks, sent (zero-copy) from the
    publisher's read-only mapping of the same file."""
    cfg = sim_config(tmp_path / "run", run__epochs=2, run__workers=2, worker__shm=worker_shm)
    cluster = LocalCluster(cfg, log_dir=tmp_path / "run" / "logs")
    try:
        assert cluster.wait(60)
    finally:
        cluster.close()
    events = read_logs(tmp_path / "run")
    served = [e["via"] for e in events if e["event"] == "weights_served"]
    synced = [e["via"] for e in events if e["event"] == "span_end" and e.get("span") == "weight_sync"]
    via = {"shm" if worker_shm else "chunks"}
    assert served and set(served) == via and set(synced) == via
    paths = {e["path"] for e in events if e["event"] == "shm_published"}
    assert paths and all(p.startswith("/dev/shm/prl-") for p in paths)
    assert not any(Path(p).exists() for p in paths)  # removed when the publisher stopped


def trainer_with(tmp_path: Path, shm: bool = True) -> TrainerCore:
    from prl_actors.config import load_config
    from prl_actors.records.rundir import MemorySink
    from prl_actors.training.sim import SimLearner

    cfg = load_config(None, {"worker.engine": "sim", "trainer.learner": "sim", "sim.param_count": 3000})
    reader = ShmReader(tmp_path) if shm else None
    core = TrainerCore(
        "trainer",
        EventLog("trainer", "trainer"),
        SimLearner(cfg.sim, cfg.run.seed),
        MemorySink(),
        4,
        1024,
        5.0,
        shm=reader,
    )
    core.run_id = RUN
    return core


def to_publisher(pub: PublisherCore, trainer: TrainerCore) -> list[m.Msg]:
    """Deliver the trainer's outbox to the publisher; the publisher's replies to the trainer."""
    out, trainer.outbox = trainer.outbox, []
    for _, msg, payloads in out:
        msg.sender = "trainer"
        pub.handle(0.0, Inbound(msg, list(payloads), peer=None, identity=b"trainer"))
    replies, pub.outbox = pub.outbox, []
    return [x for dest, x, _ in replies if dest.name != "coordinator"]


def test_a_same_host_trainer_uploads_through_a_file_the_publisher_adopts(tmp_path: Path) -> None:
    pub = publisher_with(tmp_path, snap())
    trainer = trainer_with(tmp_path)
    trainer.learner.version = 2
    trainer._upload()
    assert [m.tag_of(x) for _, x, _ in trainer.outbox] == ["weights_begin", "weights_end"]  # no chunk
    (stored,) = to_publisher(pub, trainer)
    assert isinstance(stored, m.WeightsStored) and stored.version == 2
    assert pub.current is not None and pub.current.version == 2
    assert pub.shm is not None and pub.shm.path(2) == str(snapshot_file(tmp_path, RUN, 2))
    assert not snapshot_file(tmp_path, RUN, 1).exists()  # the previous version's file is gone
    expected = Snapshot.from_tensors(2, trainer.learner.weights())
    assert bytes(pub.current.data) == bytes(expected.data)
    replies = fetch(pub, ShmReader(tmp_path).proof(RUN))  # a proven worker is told the adopted file
    assert replies[0][0].shm_path == pub.shm.path(2)


def test_a_refused_shared_upload_falls_back_to_chunks(tmp_path: Path) -> None:
    pub = publisher_with(tmp_path, snap())
    trainer = trainer_with(tmp_path)
    trainer.learner.version = 2
    trainer._upload()
    os.chmod(snapshot_file(tmp_path, RUN, 2), 0o620)  # tampered with: group-writable
    (error,) = to_publisher(pub, trainer)
    assert isinstance(error, m.Error) and "shared memory" in error.detail
    assert pub.current is not None and pub.current.version == 1 and not snapshot_file(tmp_path, RUN, 2).exists()
    error.sender = "publisher"
    trainer.handle(0.0, Inbound(error, [], peer="publisher", identity=b""))
    assert trainer.shm is None
    assert [m.tag_of(x) for _, x, _ in trainer.outbox].count("weight_chunk") > 1  # sent again, as chunks
    (stored,) = to_publisher(pub, trainer)
    assert isinstance(stored, m.WeightsStored) and pub.current.version == 2


def test_a_trainer_on_another_host_sends_chunks(tmp_path: Path) -> None:
    pub = publisher_with(tmp_path, snap())
    trainer = trainer_with(tmp_path / "elsewhere")  # no host file there: nothing proves the host
    (tmp_path / "elsewhere").mkdir()
    trainer.learner.version = 2
    trainer._upload()
    assert [m.tag_of(x) for _, x, _ in trainer.outbox].count("weight_chunk") > 1
    (stored,) = to_publisher(pub, trainer)
    assert isinstance(stored, m.WeightsStored) and stored.version == 2


def test_a_refused_chunked_upload_is_not_sent_again_at_once(tmp_path: Path) -> None:
    """Only a refused /dev/shm upload is retried (as chunks): a refused chunked upload (an older
    version than the stored one) is not sent again in a loop."""
    pub = publisher_with(tmp_path, snap(5))
    trainer = trainer_with(tmp_path, shm=False)
    trainer.learner.version = 2
    trainer._upload()
    errors = to_publisher(pub, trainer)  # the refused begin, then its orphaned end
    assert errors and all(isinstance(e, m.Error) for e in errors) and "not newer" in errors[0].detail
    for error in errors:
        error.sender = "publisher"
        trainer.handle(0.0, Inbound(error, [], peer="publisher", identity=b""))
    assert not [x for _, x, _ in trainer.outbox if isinstance(x, m.WeightsBegin)]
