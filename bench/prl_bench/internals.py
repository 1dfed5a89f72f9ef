"""Every call the benchmarks make into the runtime's internals, in one place.

The control-plane and weight-sync benchmarks drive the real actor cores (CoordinatorCore,
PublisherCore, WorkerCore) directly or inside the real `ActorHost` (Port thread + pykka actor), so
they measure exactly the runtime's code. Those are internal interfaces: when a core's constructor,
its handler entry point, its outbox or the host change, this module is the one to update. Everything
else in prl_bench uses public entry points (`prl-actors up`, LocalCluster, load_config, the wire
protocol's messages and codec).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def start_host(core: Any, zctx: Any, bind: str | None, peers: dict[str, str], security: Any = None) -> Any:
    """Start `core` in a real ActorHost (Port thread + pykka actor); returns the host object.
    `security` (transport.auth.Security): CurveZMQ on its sockets, as in a run (None: plain)."""
    from prl_actors.runtime.core import ActorHost

    host = ActorHost.start(core, zctx, bind, peers, security=security)._actor_weakref()  # type: ignore[attr-defined]
    assert host is not None, "the actor stopped while starting"
    return host


def stop_host(host: Any, timeout_s: float) -> None:
    """Ask the host's actor to stop and wait (at most `timeout_s`) until its port is closed."""
    host.actor_ref.stop(block=False)
    host.done.wait(timeout_s)


def security(keys: Path | None, name: str) -> Any:
    """CurveZMQ for the actor or client `name` with the run keys in `keys` (created there if missing);
    None when `keys` is None (plain sockets: transport.auth none)."""
    if keys is None:
        return None
    from prl_actors.transport.auth import KeyStore, Security, create_keys, run_key_names

    create_keys(keys, run_key_names())
    return Security(KeyStore(keys), name)


def close_context(zctx: Any) -> None:
    """Destroy a context, stopping its ZAP handler first (if it has one)."""
    from prl_actors.transport.auth import close_context as close

    close(zctx)


def send(host: Any, peer: str, msg: Any) -> None:
    """Send `msg` from the host's port to one of its DEALER peers (thread-safe)."""
    from prl_actors.transport.port import Dest

    host.port.send(Dest.peer(peer), msg)


def coordinator_core(log_path: Path | None, groups: int, epochs: int, timeout_s: float) -> Any:
    """A periodic CoordinatorCore over a 400-item arithmetic task, logging to `log_path`."""
    from prl_actors.coordinator.core import CoordinatorCore, CoordinatorSettings
    from prl_actors.records.logs import EventLog
    from prl_actors.tasks.base import Task, exact_match

    settings = CoordinatorSettings(
        run_id="bench",
        mode="periodic",
        epochs=epochs,
        groups_per_epoch=groups,
        group_size=8,
        heartbeat_interval_s=0.2,
        heartbeat_timeout_s=timeout_s,
        max_groups_per_request=1,
        publisher_addr="",
        buffer_addr="",
    )
    items = [(f"{a}+{b}=", str(a + b)) for a in range(20) for b in range(20)]
    log = EventLog("coordinator", "coordinator", log_path)
    return CoordinatorCore("coordinator", log, settings, Task(items, exact_match))


def feed(core: Any, now: float, msg: Any) -> list[Any]:
    """Hand `msg` to a core as its host would (from the sender's routing id); returns the messages
    the core sent in reply, and empties its outbox."""
    from prl_actors.transport.port import Inbound

    core.now = now
    core.handle(now, Inbound(msg, [], None, msg.sender.encode(), now))
    out, core.outbox = core.outbox, []
    return [m for _, m, _ in out]


def epochs_completed(core: Any) -> int:
    return int(core.epochs_completed)


def member_names(core: Any) -> list[str]:
    """The names of the coordinator's current members."""
    return [m.name for m in core.members.sorted()]


def publisher_core(chunk_bytes: int, shm_run_id: str = "") -> Any:
    """The real PublisherCore, logging nowhere, with a transfer timeout long enough for 500 MB; with
    `shm_run_id`, its shared-memory files as a registered publisher of that run would write them."""
    from prl_actors.publisher.core import PublisherCore
    from prl_actors.records.logs import EventLog
    from prl_actors.weights.shm import ShmPublisher

    shm = ShmPublisher() if shm_run_id else None
    core = PublisherCore("publisher", EventLog("publisher", "publisher"), chunk_bytes, 600.0, shm)
    if shm is not None:
        shm.open_run(shm_run_id)  # what its Welcome does
    return core


def worker_core(name: str, engine: Any, shm_run_id: str = "") -> Any:
    """The real WorkerCore around `engine`, with numpy weights (as_torch=False) and long timeouts;
    with `shm_run_id`, reading same-host snapshots of that run (as after its Welcome)."""
    from prl_actors.records.logs import EventLog
    from prl_actors.tasks.base import Task, exact_match
    from prl_actors.weights.shm import ShmReader
    from prl_actors.worker.core import WorkerCore

    task = Task(items=[("x", "y")], reward=exact_match)
    shm = ShmReader() if shm_run_id else None
    core = WorkerCore(
        name,
        EventLog(name, "worker"),
        engine,
        task,
        group_size=1,
        fetch_timeout_s=600.0,
        request_timeout_s=600.0,
        as_torch=False,
        shm=shm,
    )
    core.run_id = shm_run_id
    return core


def fetch_request(core: Any) -> Any:
    """The FetchWeights the worker core sends (its host proof included)."""
    from prl_actors.protocol.messages import FetchWeights

    proof = core.shm.proof(core.run_id) if core.shm is not None else ""
    return FetchWeights(version=-1, sender=core.name, host_proof=proof)


def snapshot(version: int, tensors: dict[str, Any]) -> Any:
    """A weight Snapshot (one contiguous buffer + metas), as the trainer builds it for an upload."""
    from prl_actors.weights.transfer import Snapshot

    return Snapshot.from_tensors(version, tensors)


def renumbered(snap: Any, version: int) -> Any:
    """The same bytes as another version (every upload of a benchmark stores a new one)."""
    from prl_actors.weights.transfer import Snapshot

    return Snapshot(version, snap.metas, snap.data)


def upload_messages(snap: Any, chunk_bytes: int) -> Any:
    """The (message, payload frames) pairs of an upload, in the trainer's order."""
    from prl_actors.weights.transfer import transfer_messages

    return transfer_messages(snap, chunk_bytes)
