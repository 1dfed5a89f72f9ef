"""Keys, the ZAP registry, names -> roles, where `auth: none` is allowed, and a dying port thread."""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

import pytest
import zmq

from prl_actors.config import load_config
from prl_actors.protocol import messages as m
from prl_actors.records.logs import EventLog
from prl_actors.records.rundir import MemorySink
from prl_actors.runtime.core import ActorHost
from prl_actors.sections import ConfigError
from prl_actors.trainer.core import TrainerCore
from prl_actors.training.sim import SimLearner
from prl_actors.transport import auth
from prl_actors.transport.port import Port
from tests.conftest import read_logs, sim_config


def test_up_keys_are_private_one_per_role(tmp_path: Path) -> None:
    made = auth.create_keys(tmp_path / "keys", auth.run_key_names())
    assert sorted(made) == sorted(r.value for r in m.Role)
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    files = list((tmp_path / "keys").iterdir())
    assert len(files) == 2 * len(made) and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert auth.create_keys(tmp_path / "keys", auth.run_key_names()) == []  # kept, never replaced
    with pytest.raises(auth.KeysError):
        auth.create_keys(tmp_path / "keys", ["mallory"])  # not a role: would name nobody


def test_registry_follows_the_directory(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    auth.create_keys(keys, ["worker", "operator"])
    store = auth.KeyStore(keys)
    public = store.public("worker")
    assert store.name_of(public) == "worker"
    auth.create_keys(keys, ["worker-gpu1"])  # while a run is up: admitted at the next handshake
    assert store.name_of(store.public("worker-gpu1")) == "worker-gpu1"
    (keys / "worker.key").unlink()  # revoked
    assert store.name_of(public) is None
    assert store.keypair_for("worker-gpu1-7")[0] == "worker-gpu1"  # own key, else the longest prefix's
    with pytest.raises(auth.KeysError):
        store.keypair_for("trainer")


def test_a_key_created_in_the_same_clock_tick_as_the_last_read_is_admitted(tmp_path: Path) -> None:
    """Directory mtimes move in clock ticks (milliseconds): LocalCluster and `up` create a worker's key
    just before starting it, maybe within the tick of the servers' last read. libzmq does not retry a
    refused handshake, so such a worker was deaf for good (seen: a run that trained without worker-1)."""
    keys = tmp_path / "keys"
    auth.create_keys(keys, ["worker-0", "operator"])
    store = auth.KeyStore(keys)
    assert store.name_of(store.public("worker-0")) == "worker-0"
    tick = os.stat(keys).st_mtime_ns
    auth.create_keys(keys, ["worker-1"])
    os.utime(keys, ns=(tick, tick))  # as if created within the same tick
    assert store.name_of(store.public("worker-1")) == "worker-1"
    assert store.name_of(b"0" * 40) is None  # still unknown: nothing else changed


def test_a_key_file_read_half_written_is_read_again(tmp_path: Path) -> None:
    """A server that lists the directory while a key file exists but is not yet written through must
    not remember that listing as complete (seen: worker-1 refused for good in a loaded test run).
    create_keys renames whole files into place; a file copied in by hand may still be caught midway."""
    keys = tmp_path / "keys"
    auth.create_keys(keys, ["worker-0"])
    store = auth.KeyStore(keys)
    assert store.name_of(store.public("worker-0")) == "worker-0"
    auth.create_keys(tmp_path / "other", ["worker-1"])
    (keys / "worker-1.key").write_text("")  # being copied: the name is there, the content not yet
    tick = os.stat(keys).st_mtime_ns
    assert store.name_of(b"0" * 40) is None  # a read that sees the half-written file
    (keys / "worker-1.key").write_text((tmp_path / "other" / "worker-1.key").read_text())
    os.utime(keys, ns=(tick, tick))  # completed within the same tick: the listing is the same
    assert store.name_of(auth.KeyStore(tmp_path / "other").public("worker-1")) == "worker-1"
    assert not [p.name for p in keys.iterdir() if p.name.endswith(".tmp")]  # create_keys left none


def test_names_roles_and_what_a_key_covers() -> None:
    assert auth.role_of_name("worker-gpu1") == m.Role.WORKER and auth.role_of_name("workers") is None
    assert auth.speaks_for("worker", "worker-3") and auth.speaks_for("worker-3", "worker-3")
    assert not auth.speaks_for("worker-3", "worker-31") and not auth.speaks_for("worker", "workers-1")
    assert not auth.speaks_for("worker-3", "worker") and not auth.speaks_for("operator", "coordinator")


@pytest.mark.parametrize(
    ("sets", "ok"),
    [
        ({"transport.host": "127.0.0.1"}, True),
        ({"transport.host": "localhost"}, True),
        ({"transport.kind": "ipc"}, True),
        ({"transport.host": "10.1.2.3"}, False),
        ({"transport.bind_all": True}, False),
        ({"transport.addresses": {"buffer": "tcp://192.168.1.5:4000"}}, False),
    ],
)
def test_auth_none_only_where_nothing_is_exposed(sets: dict, ok: bool) -> None:  # type: ignore[type-arg]
    overrides = {"transport.auth": "none", **sets}
    if ok:
        assert not load_config(None, overrides).authenticated()
    else:
        with pytest.raises(ConfigError, match="only when every bound address is loopback or ipc"):
            load_config(None, overrides)


def test_scale_bound_is_checked_in_the_config() -> None:
    with pytest.raises(ConfigError, match="exceeds run.max_workers"):
        load_config(None, {"run.workers": 5, "run.max_workers": 4})


def test_an_exception_in_the_port_thread_crashes_the_actor_loudly(run_dir: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A bug in the port thread must end the actor (logged, `error` set, `done`), never leave it deaf."""
    cfg = sim_config(run_dir)
    ctx = zmq.Context()
    core = TrainerCore(
        "trainer", EventLog("trainer", "trainer", run_dir / "logs" / "trainer.jsonl"),
        SimLearner(cfg.sim, cfg.run.seed), MemorySink(), credits=1, chunk_bytes=1 << 20, request_timeout_s=60.0,
    )  # fmt: skip

    def broken(self: Port, now: float) -> None:
        raise RuntimeError("boom in the port thread")

    monkeypatch.setattr(Port, "_retry_parked", broken)
    host = ActorHost.start(core, ctx, None, {"coordinator": "inproc://nobody"})._actor_weakref()
    try:
        assert host is not None and host.done.wait(30.0), "the actor lives on without its port thread"
        assert host.error is not None and "boom in the port thread" in host.error
    finally:
        ctx.destroy(linger=0)
    time.sleep(0.1)
    crashed = [e for e in read_logs(run_dir) if e["event"] == "actor_crashed"]
    assert crashed and "RuntimeError" in crashed[0]["error"]


def test_a_member_whose_key_is_refused_fails_at_once_with_the_reason(run_dir: Path, tmp_path: Path) -> None:
    """libzmq does not retry a handshake the server refused: a worker with an unregistered key would
    hold nothing and wait for the join timeout (60 s). It fails at once, naming the refusal."""
    from prl_actors.launch.process import LocalCluster
    from prl_actors.launch.topology import start_actor

    cfg = sim_config(run_dir, transport="tcp", run__epochs=50, sim__gen_s_per_token=0.01)
    cluster = LocalCluster(cfg, workers=1)
    ctx = zmq.Context()
    try:
        own = tmp_path / "stranger"
        auth.export_keys(cfg.keys_path(), "operator", own)  # the servers' public keys ...
        (own / "operator.key_secret").unlink()
        auth.create_keys(own, ["worker-x"])  # ... and a key of its own that the run never registered
        t0 = time.monotonic()
        host = start_actor("worker-x", cfg.model_copy(update={"transport": cfg.transport.model_copy(
            update={"keys_dir": str(own)})}), ctx, None, quiet=True)  # fmt: skip
        assert host.done.wait(20.0) and time.monotonic() - t0 < 20.0
        # the worker connects to every server at once: whichever refuses first is the one it names
        assert host.error is not None, "no error"
        assert re.search(r"the (coordinator|publisher|buffer) refused our key", host.error), host.error
    finally:
        cluster.close()
        auth.close_context(ctx)
