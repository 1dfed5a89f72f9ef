"""The launcher's policies with real processes, fast: a worker crash-looping at start-up is restarted
with back-off a bounded number of times, then the run fails with its error; free ports are picked
when none are configured."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prl_actors.config import Config
from prl_actors.launch.up import RESTART_BACKOFF_S, Child, Launcher, RunFailed, check_ports, pick_ports
from tests.conftest import sim_config


class BrokenWorkers(Launcher):
    """Workers are processes that fail as a worker whose engine cannot load does: they log their
    `actor_crashed` line (and, with `registered`, that they had joined first) and exit 1."""

    registered = False

    def _spawn(self, name: str, restarts: int = 0) -> None:
        assert name.startswith("worker-")
        log = self.run_dir.log_path(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        lines = [{"event": "registered"}] * self.registered + [{"event": "actor_crashed", "error": "no vllm"}]
        text = "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines)
        code = f"import sys; open({str(log)!r}, 'a').write({text!r}); sys.exit(1)"
        self.children[name] = Child(name, subprocess.Popen([sys.executable, "-c", code]), 0, restarts)
        self.started.append(time.monotonic())

    def supervise_workers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_workers()
            self._start_due_workers()
            time.sleep(0.01)


def launcher(run_dir: Path, restarts: int) -> BrokenWorkers:
    cfg = sim_config(run_dir, run__worker_restarts=restarts)
    out = BrokenWorkers(cfg, run_dir / "config.yaml", progress=False)
    out.started = []  # type: ignore[attr-defined]
    return out


def test_a_worker_crashing_at_start_is_restarted_with_back_off_then_the_run_fails(run_dir: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    sup = launcher(run_dir, restarts=3)
    sup._add_worker()
    message = r"worker-3 failed before registering, 4 times in a row \(run.worker_restarts = 3\): code 1: no vllm"
    with pytest.raises(RunFailed, match=message):
        sup.supervise_workers(60.0)
    started = sup.started  # type: ignore[attr-defined]
    gaps = [b - a for a, b in zip(started, started[1:], strict=False)]
    assert len(started) == 4
    for gap, backoff in zip(gaps, [RESTART_BACKOFF_S, 2 * RESTART_BACKOFF_S, 4 * RESTART_BACKOFF_S], strict=True):
        assert backoff <= gap < backoff + 5.0, gaps
    err = capsys.readouterr().err
    assert "worker-0 exited (code 1: no vllm)" in err and "restarting it in 0.5s (start-up failure 1 of 3)" in err


def test_a_worker_that_had_registered_is_replaced_at_once_without_limit(run_dir: Path) -> None:
    sup = launcher(run_dir, restarts=0)
    sup.registered = True  # it crashed later (a bug, an OOM): not a start-up failure
    sup._add_worker()
    sup.supervise_workers(2.0)
    started = sup.started  # type: ignore[attr-defined]
    assert len(started) >= 2  # replaced, and not given up on (run.worker_restarts is 0)
    assert max(b - a for a, b in zip(started, started[1:], strict=False)) < RESTART_BACKOFF_S + 2.0


def test_free_ports_are_picked_when_none_are_configured(tmp_path: Path) -> None:
    cfg: Config = sim_config(tmp_path, transport="tcp", transport__base_port=None)
    pick_ports(cfg)
    first = cfg.transport.base_port
    assert first is not None and first >= 27500 and (first - 27500) % 10 == 0
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds (TIME_WAIT is no obstacle)
        busy.bind(("127.0.0.1", first + 2))  # the buffer's port of that set
        busy.listen()
        with pytest.raises(RunFailed, match=rf"port {first + 2} on 127.0.0.1 \(buffer\) is in use"):
            check_ports(cfg)
        again = sim_config(tmp_path, transport="tcp", transport__base_port=None)
        pick_ports(again)
        assert again.transport.base_port is not None and again.transport.base_port > first
    set_by_user = sim_config(tmp_path, transport="tcp", transport__base_port=21000)
    pick_ports(set_by_user)
    assert set_by_user.transport.base_port == 21000  # configured ports are used as they are
