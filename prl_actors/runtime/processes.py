"""Process primitives every supervised process uses: start a child in its own process group with its
supervisor's pid (SUPERVISOR_ENV), signal it, stop a set of children (grace, then SIGKILL, every wait
bounded), and, on the child's side, watch for the supervisor's exit. The run supervisor (launch/
supervisor.py), the trainer's rank group (trainer/rank_group.py) and the /dev/shm snapshots (whose
writer may be gone) build on these; this module decides nothing about what a member's exit means.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Protocol

SUPERVISOR_ENV = "PRL_SUPERVISOR_PID"  # the pid whose exit stops an actor (process.py reads it)
POLL_S = 0.05
KILL_WAIT_S = 2.0  # after SIGKILL, or after SIGTERM on top of the grace period


class Proc(Protocol):
    """What the supervisor uses of a child process: `subprocess.Popen`, or a fork server's child
    (zygote.ForkedProc)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...


Forker = Callable[[list[str], dict[str, str]], Proc]
"""Starts the command line argv with exactly that environment, in its own process group."""


@dataclass
class Child:
    """One supervised process. A resumed run appends to the same log files: this process's lines
    start at `log_from`. `restarts`: the start-up crashes in a row of the members it replaces."""

    name: str
    proc: Proc
    log_from: int = 0
    restarts: int = 0
    ready: bool = False  # it bound its port: requests to its address reach this process
    stopped: bool = False  # its supervisor stopped it (a restart): its exit is no crash
    own_group: bool = True  # False: it shares its supervisor's process group (a trainer rank)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def exit_code(self) -> int:
        """Its exit code (-N: killed by signal N), read once it has exited (0 while it runs)."""
        code = self.proc.poll()
        return 0 if code is None else code

    def signal(self, sig: int) -> None:
        """`sig` to the child's whole process group, or to the child alone when it shares ours (a
        child that already exited: nothing)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.own_group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)


def spawn(
    name: str,
    argv: list[str],
    env: dict[str, str] | None = None,
    *,
    log_from: int = 0,
    restarts: int = 0,
    output: IO[bytes] | None = None,
    own_group: bool = True,
    fork: Forker | None = None,
) -> Child:
    """Start `argv` with this process as its supervisor (SUPERVISOR_ENV), in a new process group
    (`own_group`; else in ours: a stop of our group reaches it too). `env` adds to this process's
    environment; `output`: where its stdout and stderr go (None: ours). `fork`: start it by this
    instead (a fork server, `argv` then being `prl-actors`'s arguments; its own group, our output)."""
    variables = {**os.environ, SUPERVISOR_ENV: str(os.getpid()), **(env or {})}
    if fork is not None:
        return Child(name, fork(argv, variables), log_from, restarts)
    return Child(name, start_process(argv, variables, own_group, output), log_from, restarts, own_group=own_group)


def start_process(
    argv: list[str], variables: dict[str, str], own_group: bool = True, output: IO[bytes] | None = None
) -> subprocess.Popen[bytes]:
    """A new process running argv with exactly `variables` as its environment; `own_group`: in a new
    session (its own process group); `output`: where its stdout and stderr go (None: ours)."""
    stderr = subprocess.STDOUT if output is not None else None
    return subprocess.Popen(argv, env=variables, start_new_session=own_group, stdout=output, stderr=stderr)


def pid_exists(pid: int) -> bool:
    """Is there a process `pid` (one we may not signal counts: it exists)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_exit(children: list[Child], wait_s: float) -> bool:
    """Until every one of `children` has exited, at most `wait_s`; True when they all have."""
    deadline = time.monotonic() + wait_s
    while any(c.alive() for c in children):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def stop_children(children: list[Child], grace_s: float) -> None:
    """Each child that has not exited within `grace_s`: SIGKILL, and a bounded wait for it (a child
    that ignores SIGTERM or hangs in a collective). 0: kill at once (a start that failed half-way)."""
    wait_exit(children, grace_s)
    alive = [c for c in children if c.alive()]
    for c in alive:
        c.signal(signal.SIGKILL)
    wait_exit(alive, KILL_WAIT_S + 3.0)


def watch_supervisor(on_gone: Callable[[], None], pid: int | None = None, poll_s: float = 0.5) -> bool:
    """The child's side: call `on_gone` (once, from a daemon thread) when the process that started
    this one (`pid`, else SUPERVISOR_ENV's) is not its parent (any more): it was killed outright, so
    no one will stop this child. False (no watch) when this process was not started by a supervisor."""
    parent = pid if pid is not None else int(os.environ.get(SUPERVISOR_ENV, "0") or 0)
    if not parent:
        return False

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        on_gone()

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()
    return True
