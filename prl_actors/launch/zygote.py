"""A fork server for `up`'s local actors: torch, transformers and the actors imported once, not once
per actor process (`run.fork_server`, on by default for `up`).

Started by `up` before any actor. The server (`python -m prl_actors.launch.zygote`) imports PRELOAD, says
so, then forks one child per request: the child starts its own session (process group), takes the
request's environment and runs `prl-actors <argv>` exactly as `python -m prl_actors.cli.main <argv>` would; its
exit code (or -signal, as subprocess reports it) goes back to `up`. On 2 cores this takes the
imports (~4 CPU-seconds for each of six actors) off the start's critical path (docs/BENCHMARKS.md §9).

- The server forks only while it is single-threaded (one task in /proc/self/task): a fork copies
  one thread, and a lock another thread held stays locked in the child for good (Python 3.12 warns
  "This process is multi-threaded, use of fork() may lead to deadlocks"). Imports alone start no
  thread but one: OpenBLAS (numpy's) starts a pool of cores - 1 threads when it loads, so the server
  runs with OPENBLAS_NUM_THREADS=1 (SINGLE_THREADED); torch's intra-op pool, zmq and logging threads
  appear only on first use, never in the server. A request the server gets while it has other
  threads anyway is refused (`up` then starts that actor, and every later one, as a new process).
  Each answer carries the server's thread count at that fork (`Zygote.fork_threads`). No sockets
  or torch ops exist in the server either, so a child starts as clean as a new interpreter that
  has imported the same modules.
- The server is titled `prl-actors fork-server (run NAME)` (prl_actors/launch/proctitle.py: no thread
  started), and a child titles itself once it knows its actor's name (`prl-actors actor`), so `ps`
  tells them apart; until then a child reads as the server.
- A child's supervisor (SUPERVISOR_ENV) is the server, its parent: the server exits when `up` does
  (its socket closes, or its parent changes), and the children then stop by themselves as they do
  when `up` is killed outright.
- `ForkedProc` offers what the supervisor uses of `subprocess.Popen` (pid, poll, wait, returncode,
  send_signal), so a forked actor is supervised like any other child. If the server itself dies,
  a child that has exited reads as exit code 1 (its real code died with the server).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

from prl_actors.launch.proctitle import set_title
from prl_actors.runtime.processes import SUPERVISOR_ENV, pid_exists

PRELOAD = ("prl_actors.launch.process", "prl_actors.launch.topology", "prl_actors.cli.main")
"""What the server imports once: the CLI, the actor runtime and every actor with its model code."""
ENTRY = "prl_actors.cli.main"  # the module whose main() a forked child runs, as `python -m prl_actors.cli.main` would
CLI = [sys.executable, "-m", ENTRY]  # the command line a forked child stands for
FD_ENV = "PRL_ZYGOTE_FD"  # the server's end of its socket to `up`
READY_TIMEOUT_S = 120.0
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1"}  # the server's environment: no BLAS pool at import
LOST_CODE = 1  # the exit code of a child whose server died before reporting it


class ZygoteError(Exception):
    """The fork server could not start or fork (the caller starts actors as new processes instead)."""


# --- `up`'s side ------------------------------------------------------------------------------------


class Zygote:
    """The running fork server, seen from `up`: `spawn` forks an actor, a reader thread collects
    the children's exit codes."""

    def __init__(self, run: str = "") -> None:
        """`run`: the run's name, in the server's process title."""
        ours, theirs = socket.socketpair()
        variables = {**os.environ, FD_ENV: str(theirs.fileno()), **SINGLE_THREADED}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prl_actors.launch.zygote", *([run] if run else [])],
            env=variables,
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.sock = ours
        self.file = ours.makefile("rwb", buffering=0)
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.spawned: dict[int, threading.Event] = {}  # request id -> its answer arrived
        self.answers: dict[int, dict[str, Any]] = {}
        self.exits: dict[int, int] = {}  # pid -> exit code (as subprocess reports it)
        self.fork_threads: list[int] = []  # the server's thread count at each fork (1: single-threaded)
        self.next_id = 0
        self.error = ""
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until the server has imported PRELOAD; ZygoteError if it died or took longer."""
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.05):
            if self.proc.poll() is not None or self.error:
                raise ZygoteError(f"the fork server exited ({self.error or self.proc.returncode})")
            if time.monotonic() > deadline:
                raise ZygoteError(f"the fork server did not import its modules within {timeout_s:g}s")

    def spawn(self, argv: list[str], env: dict[str, str]) -> ForkedProc:
        """Fork the command line `argv` (`python -m prl_actors.cli.main ...`: CLI + the arguments) with `env` as
        its whole environment (its supervisor: the server, its parent); its stdout and stderr are the
        server's, i.e. `up`'s."""
        if argv[: len(CLI)] != CLI:
            raise ZygoteError(f"the fork server runs prl-actors only, not {argv[:3]}")
        self.wait_ready()
        with self.lock:
            self.next_id += 1
            rid = self.next_id
            done = self.spawned[rid] = threading.Event()
            request: dict[str, Any] = {"id": rid, "argv": argv[len(CLI) :], "env": env}
            try:
                self.sock.sendall(json.dumps(request).encode() + b"\n")
            except OSError as exc:
                raise ZygoteError(f"the fork server is gone ({exc})") from None
        if not done.wait(30.0):
            raise ZygoteError("the fork server did not answer a fork within 30s")
        answer = self.answers.pop(rid)
        if "error" in answer:
            raise ZygoteError(answer["error"])
        self.fork_threads.append(int(answer.get("threads", 0)))
        return ForkedProc(int(answer["pid"]), self)

    def close(self) -> None:
        """Stop the server (its children are supervised, and stopped, by `up` itself); at once when
        it never forked (a run refused before its first actor: it may still be importing)."""
        if self.next_id == 0:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self) -> None:
        try:
            for line in self.file:
                msg = json.loads(line)
                if "ready" in msg:
                    self.ready.set()
                elif "exit" in msg:
                    self.exits[int(msg["exit"])] = int(msg["code"])
                elif "id" in msg:
                    self.answers[int(msg["id"])] = msg
                    self.spawned.pop(int(msg["id"])).set()
        except (OSError, ValueError) as exc:
            self.error = str(exc)
        self.error = self.error or "its socket closed"
        for done in list(self.spawned.values()):  # nobody answers these any more
            done.set()


class ForkedProc:
    """A child of the fork server, with the part of `subprocess.Popen` the supervisor uses."""

    def __init__(self, pid: int, zygote: Zygote) -> None:
        self.pid, self.zygote = pid, zygote
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self.zygote.exits.get(self.pid)
            if code is None and not self.zygote.alive() and not pid_exists(self.pid):
                code = LOST_CODE
            self.returncode = code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


# --- the server -------------------------------------------------------------------------------------


def serve(sock: socket.socket, run: str = "") -> None:
    """Import PRELOAD, then fork a child per request until `up` closes the socket or exits; titled
    `prl-actors fork-server (run RUN)`."""
    parent = os.getppid()
    set_title("fork-server", run)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is `up`'s to handle
    for module in PRELOAD:
        importlib.import_module(module)
    _send(sock, {"ready": True})
    buffer = b""
    children: set[int] = set()
    while os.getppid() == parent:
        readable, _, _ = select.select([sock], [], [], 0.05)
        _reap(sock, children)
        if not readable:
            continue
        try:
            data = sock.recv(65536)
        except OSError:
            return
        if not data:
            return  # `up` closed its end
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            threads = thread_count()
            if threads != 1:
                _send(sock, {"id": request["id"], "error": f"not forking: the fork server has {threads} threads"})
                continue
            started_r, started_w = os.pipe()
            try:
                pid = os.fork()
            except OSError as exc:
                os.close(started_r)
                os.close(started_w)
                _send(sock, {"id": request["id"], "error": f"fork failed: {exc}"})
                continue
            if pid == 0:
                os.close(started_r)
                _child(sock, request, started_w)  # never returns
            os.close(started_w)
            os.read(started_r, 1)  # EOF once the child has its own session: `up` may signal its group
            os.close(started_r)
            children.add(pid)
            _send(sock, {"id": request["id"], "pid": pid, "threads": threads})


def thread_count() -> int:
    """This process's threads as the OS sees them (native ones too: a BLAS pool is no Python thread)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no /proc: the Python threads are all that can be counted
        return threading.active_count()


def _reap(sock: socket.socket, children: set[int]) -> None:
    for pid in list(children):
        with contextlib.suppress(ChildProcessError):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(json.dumps(msg).encode() + b"\n")


def _child(sock: socket.socket, request: dict[str, Any], started: int) -> None:
    """The forked actor: its own session (then `started` closes), the request's environment and
    argv; exits, never returns."""
    code = 1
    try:
        sock.close()
        os.setsid()
        os.close(started)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[SUPERVISOR_ENV] = str(os.getppid())
        os.environ.pop(FD_ENV, None)
        _reseed()
        sys.argv = ["prl-actors", *request["argv"]]
        code = _exit_code(importlib.import_module(ENTRY).main)  # imported already (PRELOAD)
    except BaseException:  # noqa: BLE001 - the child must end here, whatever happened
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            import atexit

            atexit._run_exitfuncs()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _reseed() -> None:
    """A fork shares its parent's random state: each child draws fresh seeds, as a new interpreter
    would (run seeds that the config sets are applied later, by the actor itself). Python's `random`
    reseeds itself after a fork; numpy's global generator does not."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _exit_code(main: Any) -> int:
    """Run `main()` (the CLI: it reads sys.argv) and turn its end into an exit code."""
    try:
        main()
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    serve(socket.socket(fileno=int(os.environ[FD_ENV])), sys.argv[1] if len(sys.argv) > 1 else "")
