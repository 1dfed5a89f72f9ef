"""Multi-host without containers: workers in their own network namespaces, over tcp, by address only.

Topology (made here, torn down after, also on failure; needs root and iproute2):

    hub ns   lo 10.213.0.1/32  <- coordinator, publisher, buffer, trainer (`prl-actors up --workers 0`)
             veth 10.213.I.1/24  ----  worker ns I: veth 10.213.I.2/24, default route via 10.213.I.1

The 10.213.0.0/16 addresses exist only inside these namespaces (never in the host's), so no traffic
leaves the machine. Each worker is `prl-actors actor worker --coordinator tcp://10.213.0.1:PORT`: its
config names no reachable host, the coordinator's Status tells it where the publisher and buffer are.
A partition takes one worker's link down for longer than the heartbeat timeout, then up again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prl_actors.config import Config
from tests.conftest import assert_invariants, port_base, read_logs, sim_config, wait_for

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (ip netns)"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 (`ip`) is not installed"),
]
CLI = [sys.executable, "-m", "prl_actors.cli.main"]
HUB_ADDR = "10.213.0.1"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


class Hosts:
    """A hub namespace and one namespace per worker, joined by veth pairs (the 'hosts' of a test)."""

    def __init__(self, workers: int) -> None:
        tag = f"{os.getpid() % 100000}"
        self.hub = f"prl{tag}h"
        self.workers = [f"prl{tag}w{i}" for i in range(1, workers + 1)]
        self.links = {ns: (f"pv{tag}a{i}", f"pv{tag}b{i}") for i, ns in enumerate(self.workers, 1)}
        self.procs: list[subprocess.Popen[bytes]] = []

    def create(self) -> None:
        ip("netns", "add", self.hub)
        ip("-n", self.hub, "link", "set", "lo", "up")
        ip("-n", self.hub, "addr", "add", f"{HUB_ADDR}/32", "dev", "lo")
        for i, ns in enumerate(self.workers, 1):
            hub_end, ns_end = self.links[ns]
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", self.hub, "link", "add", hub_end, "type", "veth", "peer", "name", ns_end, "netns", ns)
            ip("-n", self.hub, "addr", "add", f"10.213.{i}.1/24", "dev", hub_end)
            ip("-n", ns, "addr", "add", f"10.213.{i}.2/24", "dev", ns_end)
            ip("-n", self.hub, "link", "set", hub_end, "up")
            ip("-n", ns, "link", "set", ns_end, "up")
            ip("-n", ns, "route", "add", "default", "via", f"10.213.{i}.1")

    def link(self, ns: str, up: bool) -> None:
        """Take the hub's end of a worker's link down (a partition) or up again. (Downing the worker's
        end would also drop its default route, which the kernel does not restore on the way up.)"""
        ip("-n", self.hub, "link", "set", self.links[ns][0], "up" if up else "down")

    def run(self, ns: str, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def destroy(self) -> None:
        """Stop what we started (by pid), then delete the namespaces (which deletes the veths)."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)  # `up` stops its actors on SIGINT; actors stop on it too
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        for ns in [self.hub, *self.workers]:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:  # only processes of these namespaces, which this test started
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    h = Hosts(workers=2)
    try:
        h.create()
        yield h
    finally:
        h.destroy()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert h.hub not in left and not any(ns in left for ns in h.workers), "a namespace was left behind"


def netns_config(run_dir: Path) -> Config:
    return sim_config(
        run_dir, transport="tcp", run__epochs=5, run__workers=0,
        transport__host=HUB_ADDR, transport__base_port=port_base(), transport__request_timeout_s=2.0,
        coordinator__groups_per_epoch=8, coordinator__heartbeat_interval_s=0.1,
        coordinator__heartbeat_timeout_s=1.0, sim__gen_s_per_token=0.03,
    )  # fmt: skip


def cfg_run_dir(cfg: Config) -> Path:
    return Path(cfg.run.run_dir)


def start_run(hosts: Hosts, cfg: Config, tmp_path: Path) -> subprocess.Popen[bytes]:
    """Core actors in the hub; each worker in its own namespace, told only the coordinator's address."""
    hub_cfg = tmp_path / "hub.yaml"
    hub_cfg.write_text(cfg.dump())
    up = hosts.run(hosts.hub, [*CLI, "up", "--config", str(hub_cfg)], tmp_path / "up.log")
    wait_for(cfg_run_dir(cfg), lambda e: e["event"] == "actor_start" and e["actor"] == "coordinator", timeout=60)
    worker_cfg = tmp_path / "worker.yaml"  # no address in it is reachable from a worker namespace
    unreachable = cfg.model_copy(update={"transport": cfg.transport.model_copy(update={"host": "127.0.0.9"})})
    worker_cfg.write_text(unreachable.dump())
    coordinator = f"tcp://{HUB_ADDR}:{cfg.transport.base_port}"
    for i, ns in enumerate(hosts.workers, 1):
        argv = [*CLI, "actor", "worker", "--config", str(worker_cfg), "--name", f"worker-ns{i}"]
        hosts.run(ns, [*argv, "--coordinator", coordinator], tmp_path / f"worker-ns{i}.log")
    return up


def test_workers_in_namespaces_survive_a_partition(hosts: Hosts, tmp_path: Path, run_dir: Path) -> None:
    cfg = netns_config(run_dir)
    up = start_run(hosts, cfg, tmp_path)
    victim = "worker-ns1"
    wait_for(run_dir, lambda e: e["event"] == "assign" and e["worker"] == victim and e["epoch"] >= 1, timeout=60)
    hosts.link(hosts.workers[0], up=False)
    cut = time.monotonic()
    requeue = wait_for(run_dir, lambda e: e["event"] == "requeue" and e["worker"] == victim, timeout=10)
    time.sleep(max(0.0, cut + 2.5 - time.monotonic()))  # down for 2.5x the heartbeat timeout
    hosts.link(hosts.workers[0], up=True)
    assert up.wait(90) == 0, (tmp_path / "up.log").read_text()
    assert requeue["reason"] == "heartbeat_timeout" and requeue["groups"], requeue
    events = read_logs(run_dir)
    rejoin = [e for e in events if e["event"] == "member_join" and e["member"] == victim]
    assert len(rejoin) >= 2 and rejoin[-1]["t_mono"] > requeue["t_mono"], "the partitioned worker did not rejoin"
    trained_after = [
        e for e in events if e["event"] == "train_group" and e["t_mono"] > rejoin[-1]["t_mono"]
        and any(s["event"] == "group_sent" and s["actor"] == victim and s["group_id"] == e["group_id"]
                and s["msg_epoch"] == e["msg_epoch"] for s in events)
    ]  # fmt: skip
    assert trained_after, "the rejoined worker's groups were never trained"
    assert_invariants(run_dir, epochs=5, groups=8)
    check = subprocess.run([*CLI, "replay", str(run_dir), "--check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
