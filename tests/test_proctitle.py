"""Issue 41 item 6: process titles. `ps` showed every forked actor as `python -m prl_actors.launch.zygote`;
now `up`, its fork server and each actor read `prl-actors NAME (run RUN)` in /proc/PID/cmdline
(`ps -o args`) and `prl-NAME` in /proc/PID/comm (`top`), forked or started as new processes; without
setproctitle the kernel name is still set (prctl)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from prl_actors.launch.proctitle import comm, title
from tests.conftest import read_logs

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "prl_actors.cli.main"]
CORE = ("coordinator", "publisher", "buffer", "trainer")
ACTORS = (*CORE, "worker-0", "worker-1")
T = TypeVar("T")


def cmdline(pid: int) -> str:
    """/proc/PID/cmdline as `ps -o args` shows it (NULs between arguments, a title's padding dropped)."""
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a)


def kernel_name(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def poll(what: str, check: Callable[[], T | None], timeout: float = 120.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, json.JSONDecodeError):  # gone; being written
            if (found := check()) is not None:
                return found
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout:g}s")


def starts(run_dir: Path) -> list[tuple[str, int]]:
    """(actor, pid) of each `actor_start` in the logs (an actor titles itself before it logs this)."""
    return [(e["actor"], e["pid"]) for e in read_logs(run_dir) if e["event"] == "actor_start"]


def started(run_dir: Path) -> dict[str, int] | None:
    """Each actor's pid once every one of ACTORS has started."""
    pids = dict(starts(run_dir))
    return pids if set(ACTORS) <= set(pids) else None


def spares(up: int) -> dict[str, int] | None:
    """The pids of the four spares (run.standby_core) by title, once they all wait."""
    found = {cmdline(p): p for p in descendants(up) if cmdline(p).startswith("prl-actors spare-")}
    return found if len(found) == len(CORE) else None


@pytest.mark.parametrize("forked", [True, False], ids=["fork-server", "new-processes"])
def test_up_and_every_actor_show_their_title_with_the_runs_name(tmp_path: Path, forked: bool) -> None:
    run_dir, run = tmp_path / "run", f"titles-{'on' if forked else 'off'}"
    cmd = [*CLI, "up", "--config", str(ROOT / "configs/demo.yaml"), "--run-dir", str(run_dir), "--epochs", "1000"]
    cmd += ["--set", f"run.name={run}", "--set", f"run.fork_server={str(forked).lower()}"]
    cmd += ["--set", f"run.standby_core={str(forked).lower()}"]  # spares: with the fork server, where they're cheap
    err = open(tmp_path / "up.err", "w")  # noqa: SIM115 - the child holds it; closed below
    up = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
    try:
        pids = poll("every actor started", lambda: started(run_dir))
        shown = {name: (cmdline(pids[name]), kernel_name(pids[name])) for name in ACTORS}
        assert shown == {name: (title(name, run), comm(name)) for name in ACTORS}
        assert (cmdline(up.pid), kernel_name(up.pid)) == (f"prl-actors up (run {run})", "prl-up")
        servers = [p for p in children(up.pid) if kernel_name(p) == "prl-fork-server"]
        assert len(servers) == int(forked), [cmdline(p) for p in children(up.pid)]
        if forked:  # the actors are the server's children: `ps --forest` shows which run they belong to
            assert cmdline(servers[0]) == f"prl-actors fork-server (run {run})"
            assert set(pids[name] for name in ACTORS) <= set(children(servers[0]))
            spares_titled_then_taken(up.pid, run_dir, run, pids["coordinator"])
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        finally:
            up.kill()
            err.close()


def spares_titled_then_taken(up: int, run_dir: Path, run: str, coordinator: int) -> None:
    """The spares (run.standby_core) read `spare-NAME` while they wait; the coordinator's spare,
    once it takes over from the coordinator SIGKILLed now, reads `coordinator`."""
    waiting = poll("the four spares wait", lambda: spares(up))
    assert set(waiting) == {title(f"spare-{name}", run) for name in CORE}
    spare = waiting[title("spare-coordinator", run)]
    assert kernel_name(spare) == "prl-spare-coord"
    os.kill(coordinator, signal.SIGKILL)  # `up` restarts the core from its spares
    poll("the spare coordinator took over", lambda: ("coordinator", spare) in starts(run_dir) or None)
    assert (cmdline(spare), kernel_name(spare)) == (title("coordinator", run), comm("coordinator"))


def test_names_fit_the_kernels_15_bytes() -> None:
    assert title("worker-0", "demo") == "prl-actors worker-0 (run demo)"
    assert comm("worker-0") == "prl-worker-0" and comm("coordinator") == "prl-coordinator"
    assert comm("worker-123456") == "prl-worker-1234"


WITHOUT_SETPROCTITLE = """
import sys
sys.modules["setproctitle"] = None  # its import fails, as where the package is missing
from prl_actors.launch.proctitle import set_title
before = open("/proc/self/cmdline", "rb").read()
set_title("worker-3", "demo")
print(open("/proc/self/comm").read().strip(), open("/proc/self/cmdline", "rb").read() == before)
"""


def test_without_setproctitle_the_kernel_name_is_still_set() -> None:
    out = subprocess.run([sys.executable, "-c", WITHOUT_SETPROCTITLE], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["prl-worker-3", "True"]  # the name by prctl; the command line untouched
