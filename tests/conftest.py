"""Shared fixtures: small sim configs, run dirs, log readers."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

# Models in the test process compute on one thread: on a small shared machine OpenMP threads that
# spin-wait for each other make a warm start many times slower, and the tests measure no speed.
# (Actor processes the tests start choose their own threads: worker/trainer.threads.)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Built-in models are cached between runs (model/builtin.py cache_dir): the tests share one cache of
# their own, so they neither read nor fill the user's.
os.environ.setdefault("PRL_CACHE_DIR", tempfile.mkdtemp(prefix="prl-test-cache-"))

from prl_actors.config import Config, load_config  # noqa: E402
from prl_actors.protocol.versions import on_policy  # noqa: E402
from prl_actors.transport.auth import KeyStore, Security, create_keys, run_key_names  # noqa: E402


def _port_bases() -> Iterator[int]:
    """Base ports in steps of 10 within this process's band of 20000-31999 (below Linux's ephemeral
    range, 32768-60999, where a bind can collide with any outgoing connection). Under pytest-xdist
    each worker has a band of its own, so two tests running at once never share a port; a band is
    reused from its start once used up (its first runs ended long before)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    band = 12000 // max(workers, 1) // 10 * 10
    low, k = 20000 + worker * band, (os.getpid() % 200) * 20 % band  # apart from another session's
    while True:
        yield low + k
        k = (k + 10) % band


_ports = _port_bases()


def port_base() -> int:
    """A fresh tcp base port for one run (its actors bind base .. base + 5)."""
    return next(_ports)


def sim_config(run_dir: Path, transport: str = "inproc", **overrides: object) -> Config:
    """A fast simulated config; `overrides` are dotted keys with '__' for '.'."""
    base: dict[str, object] = {
        "run.name": f"t{port_base()}",
        "run.run_dir": str(run_dir),
        "run.epochs": 3,
        "run.workers": 2,
        "transport.kind": transport,
        "transport.base_port": port_base(),
        "coordinator.groups_per_epoch": 6,
        "coordinator.heartbeat_interval_s": 0.05,
        "coordinator.heartbeat_timeout_s": 0.5,
        "worker.engine": "sim",
        "worker.group_size": 4,
        "trainer.learner": "sim",
        "sim.gen_s_per_token": 0.0005,
        "sim.tokens_per_sample": 4,
        "sim.train_s_per_sample": 0.0005,
        "sim.param_count": 4096,
    }
    base.update({k.replace("__", "."): v for k, v in overrides.items()})
    return load_config(None, base)


def worker_contract(cfg: Config):  # type: ignore[no-untyped-def]
    """The generation contract a worker built from `cfg` registers with: a hand-driven worker must
    send it too (runtime/contract.py; the coordinator refuses a worker without the run's)."""
    from prl_actors.launch import build
    from prl_actors.launch.topology import generation_contract

    return generation_contract(cfg, build.task(cfg))


def alive(pid: int) -> bool:
    """Running, not a zombie (a killed child of ours waits to be reaped). A process that exits while
    its stat file is read is not alive either (ProcessLookupError)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def read_logs(run_dir: Path) -> list[dict]:
    """Every event of every actor, ordered by monotonic time."""
    events = []
    for path in sorted((run_dir / "logs").glob("*.jsonl")):
        events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(events, key=lambda e: e["t_mono"])


def wait_for(run_dir: Path, pred: Callable[[dict], bool], timeout: float = 20.0) -> dict:
    """The first logged event matching `pred`, polling the run's logs (fails after `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "logs").exists():
            try:
                found = next((e for e in read_logs(run_dir) if pred(e)), None)
            except json.JSONDecodeError:  # a line being written right now: read again
                found = None
            if found is not None:
                return found
        time.sleep(0.02)
    raise AssertionError(f"no matching event within {timeout}s")


def assert_invariants(run_dir: Path, epochs: int, groups: int, external: frozenset = frozenset()) -> None:
    """On-policy, exactly-once, one optimizer step per epoch, versions +1 — from the logs alone.
    `external`: (epoch, group) keys sent by a peer that writes no log (a hand-driven socket)."""
    events = read_logs(run_dir)
    refused = {e["msg_id"] for e in events if e["event"] == "train_refused"}  # generated again, then trained
    trained = [e for e in events if e["event"] == "train_group" and e.get("msg_id") not in refused]
    for e in trained:
        assert on_policy(e["msg_epoch"], e["msg_version"]) and e["msg_epoch"] == e["epoch"], f"off-policy: {e}"
    keys = [(e["msg_epoch"], e["group_id"]) for e in trained]
    assert len(keys) == len(set(keys)), "a group was trained twice"
    assert sorted(keys) == [(ep, g) for ep in range(epochs) for g in range(groups)], "a group is missing"
    steps = [e for e in events if e["event"] == "optimizer_step"]
    assert [(s["version_before"], s["version_after"]) for s in steps] == [(v, v + 1) for v in range(epochs)]
    sent = {(e["msg_epoch"], e["group_id"], e["msg_version"]) for e in events if e["event"] == "group_sent"}
    for e in trained:  # some worker generated it with the very version it was trained under
        key = (e["msg_epoch"], e["group_id"])
        assert (*key, e["msg_version"]) in sent or key in external, f"no worker sent {key} at v{e['msg_version']}"


def run_keys(cfg: Config) -> None:
    """The run's keys, as `prl-actors up` creates them (for tests that start actors without `up`)."""
    if cfg.authenticated():
        create_keys(cfg.keys_path(), run_key_names())


def dealer(
    ctx: zmq.Context, cfg: Config, actor: str, name: str, keys: Path | None = None, key: str | None = None
) -> zmq.Socket:
    """A hand-driven DEALER to `actor`'s bound socket with routing id `name`, holding the key `key`
    (default: the one that covers `name`) from the run's keys (or from `keys`); without
    authentication (inproc, auth none) a plain one."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, name.encode())
    if cfg.authenticated():
        Security(KeyStore(keys or cfg.keys_path()), key or name).connect(sock, actor)
    sock.connect(cfg.address(actor))
    return sock


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random-init Qwen2 / Llama / GPT-2 / Mistral checkpoints, built once per session."""
    from prl_actors.model.tiny import build_all

    return build_all(tmp_path_factory.mktemp("families"))


# --- test tiers ------------------------------------------------------------------------------------
# Every test is in exactly one tier, named by a marker its module declares at its top
# (`pytestmark = pytest.mark.fast`, or in its pytestmark list; one test may mark itself):
#   fast         the unit and socket-free core tests (in-process, inproc:// at most; no OS process, no
#                tcp/ipc socket, no HTTP server): `make test-fast`, the inner loop, < 90 s on 2 cores
#   integration  real processes, sockets, the CLI's `up`, ranks: `make test` (with fast)
#   e2e          whole runs through `up` that repeat a path a cheaper test in `make test` already
#                covers: `make test-e2e` (CI runs it after `make test`)
# A module that names no tier is integration (a new module is safe by default: `make test` runs it);
# mark it fast once it is quick and socket-free. tests/test_tiers.py keeps the rule honest.
TIERS = ("fast", "integration", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that names no tier is `integration`."""
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker("integration")
