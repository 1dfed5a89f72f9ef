"""Running actors: one per OS process (`prl-actors actor`), or all in one process (tests, benchmarks)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pykka
import zmq

from prl_actors.launch.proctitle import set_title
from prl_actors.launch.supervisor import STANDBY_ENV as STANDBY_ENV  # set by `up` for a spare core actor
from prl_actors.launch.supervisor import START_GATE_ENV as START_GATE_ENV  # set by `up` for the trainer and workers
from prl_actors.launch.supervisor import STOP_SIGNALS
from prl_actors.launch.topology import role_of, start_actor
from prl_actors.plugins import STOPPING
from prl_actors.runtime.core import ActorHost, StartFailed, StopRequest
from prl_actors.runtime.processes import SUPERVISOR_ENV as SUPERVISOR_ENV  # set by `up` for the actors it starts
from prl_actors.runtime.processes import watch_supervisor
from prl_actors.runtime.threads import LOCAL_WORKERS_ENV as LOCAL_WORKERS_ENV  # set by `up` for its local actors
from prl_actors.runtime.threads import limit_actor_threads
from prl_actors.transport.auth import KeysError, close_context, create_keys, ensure_key, run_key_names

if TYPE_CHECKING:
    from prl_actors.config import Config


class ActorFailed(Exception):
    pass


def run_actor_process(name: str, cfg: Config, quiet: bool = False) -> int:
    """Run one actor until it stops; returns its exit code, raises ActorFailed with its one-line error.

    SIGTERM/SIGINT/SIGHUP ask it to stop (a worker leaves gracefully first). An actor that has not
    stopped `run.stop_grace_s` later (a thread stuck in a handler or an engine) is given up on: the
    caller exits the process anyway (`exit_now`), as on a second signal. Started by `up`, an actor
    whose supervisor has gone (SIGKILLed) stops by itself, while it is still building too
    (`exit_if_orphaned_while_starting`). A spare (STANDBY_ENV) first waits to be
    needed (`await_standby`), titled `spare-NAME` till then (`ps`: docs/DEBUGGING.md)."""
    if await_standby():
        set_title(name, cfg.run.name)  # a spare no more: the actor it stood in for
    limit_actor_threads(role_of(name), cfg.worker, cfg.trainer)
    starting = exit_if_orphaned_while_starting(name)
    ctx = zmq.Context()
    try:
        host = start_actor(name, cfg, ctx, Path(cfg.run.run_dir) / "logs", quiet=quiet, gate=start_gate(cfg))
    except (StartFailed, KeysError) as exc:  # KeysError: its own or a peer's key file is missing
        close_context(ctx)
        raise ActorFailed(f"{name}: {exc}") from None
    finally:
        starting.clear()
    reason = serve_until_stopped(host, cfg.run.stop_grace_s)
    if reason:
        raise ActorFailed(f"{name}: did not stop within {cfg.run.stop_grace_s:g}s of {reason} (a stuck thread?)")
    close_context(ctx)
    if host.error:
        raise ActorFailed(f"{name}: {host.error}")
    return 0


GATE_POLL_S = 0.02
ORPHAN_POLL_S = 0.2


def exit_if_orphaned_while_starting(name: str) -> threading.Event:
    """Started by `up` (SUPERVISOR_ENV): until the returned event is cleared (the actor has started or
    failed to), exit 1 with one line as soon as `up` is gone. A SIGKILLed `up` stops no one, and an
    actor building itself (imports, a model load that takes minutes for a large model) reaches the
    start gate's check only once the build is done, holding its memory meanwhile. After the start,
    serve_until_stopped watches the supervisor instead."""
    starting = threading.Event()
    starting.set()

    def gone() -> None:
        if starting.is_set():
            print(
                f"error: {name}: failed to start: prl-actors up exited while it was starting",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)

    watch_supervisor(gone, poll_s=ORPHAN_POLL_S)
    return starting


def start_gate(cfg: Config) -> Callable[[], None] | None:
    """The wait `up` asks of an actor it starts before this run's servers hold their ports (None:
    no wait). The actor builds itself (imports, model) meanwhile, then waits here for the file
    named by START_GATE_ENV, at most transport.join_timeout_s, and no longer than its supervisor."""
    gate = os.environ.get(START_GATE_ENV, "")
    if not gate:
        return None
    path, supervisor = Path(gate), int(os.environ.get(SUPERVISOR_ENV, "0") or 0)

    def wait() -> None:
        deadline = time.monotonic() + cfg.transport.join_timeout_s
        while not path.exists():
            if supervisor and os.getppid() != supervisor:
                raise RuntimeError("prl-actors up exited before the run's servers were up")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the run's servers were not up within {cfg.transport.join_timeout_s:g}s")
            time.sleep(GATE_POLL_S)

    return wait


def await_standby() -> bool:
    """A spare core actor (run.standby_core): its imports are done (this module imports topology,
    torch with it), nothing is logged, built, bound or connected yet. Wait, without a deadline, until
    `up` needs it (creates the file named by STANDBY_ENV: a core restart); never past `up` itself.
    True once it was needed; no-op (False) for any other actor."""
    gate = os.environ.get(STANDBY_ENV, "")
    if not gate:
        return False
    path, supervisor = Path(gate), int(os.environ.get(SUPERVISOR_ENV, "0") or 0)
    while not path.exists():
        if supervisor and os.getppid() != supervisor:
            raise ActorFailed("a spare whose prl-actors up is gone: not needed")
        time.sleep(GATE_POLL_S)
    return True


def serve_until_stopped(host: ActorHost, grace_s: float) -> str:
    """This process's actor (any runtime's ActorHost) until it stops: by itself, or asked to by a
    stop signal, its port's crash or its supervisor's exit (SUPERVISOR_ENV). '' when it stopped;
    else why it was asked to and did not stop within `grace_s` (the caller exits anyway)."""
    reason = _wait(host, _catch_stop_signals())
    return reason if reason and not host.done.wait(grace_s) else ""


def _wait(host: ActorHost, signalled: threading.Event) -> str:
    """Wait until the actor stops by itself ("") or is asked to (the reason, after asking it)."""
    supervisor = int(os.environ.get(SUPERVISOR_ENV, "0") or 0)
    while not host.done.wait(0.1):
        reason = "a signal" if signalled.is_set() else ""
        if host.error:  # the port thread died: the actor is stopping (and exits non-zero)
            reason = "its port's crash"
        if supervisor and os.getppid() != supervisor:
            reason = "its supervisor's exit"
        if reason:
            STOPPING.set()  # a plugin's wait (a reward's thread) ends now: the actor can stop (plugins.py)
            request_stop(host, reason)
            return reason
    return ""


def _catch_stop_signals() -> threading.Event:
    """First stop signal: set the event (a graceful stop); a second one exits at once."""
    signalled = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if signalled.is_set():
            exit_now(128 + signum)
        signalled.set()

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)
    return signalled


def exit_now(code: int) -> None:
    """End the process now: a stuck actor thread (not a daemon) or slow library finalizers must not
    keep it alive. Logs are line-buffered and closed by the actor; stdio is flushed here."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def request_stop(host: ActorHost, reason: str) -> None:
    """Ask the actor to stop from outside its thread (a worker says Leave first)."""
    with contextlib.suppress(pykka.ActorDeadError):  # already gone: nothing to stop
        host.actor_ref.tell(StopRequest(reason))


class LocalCluster:
    """All actors in this process (inproc:// by default): the fast path for tests."""

    def __init__(self, cfg: Config, workers: int | None = None, log_dir: Path | None = None) -> None:
        self.cfg, self.log_dir = cfg, log_dir
        self.ctx = zmq.Context()
        if cfg.authenticated():  # the run's keys, as `prl-actors up` makes them
            create_keys(cfg.keys_path(), run_key_names())
        self.hosts: dict[str, ActorHost] = {}
        self.removed: list[ActorHost] = []  # their sockets are still the context's until they are done
        self._next_worker = 0
        try:
            for name in ("coordinator", "publisher", "buffer", "trainer"):
                self.hosts[name] = start_actor(name, cfg, self.ctx, log_dir, quiet=True)
            for _ in range(cfg.run.workers if workers is None else workers):
                self.add_worker()
        except BaseException:  # one actor failed to start: the ones already running must not leak
            with contextlib.suppress(RuntimeError):  # one that does not stop: the start error says more
                self.close()
            raise

    def add_worker(self) -> str:
        name = f"worker-{self._next_worker}"
        self._next_worker += 1
        ensure_key(name, self.cfg.keys_path(), self.cfg.authenticated())
        self.hosts[name] = start_actor(name, self.cfg, self.ctx, self.log_dir, quiet=True)
        return name

    def remove_worker(self, name: str, graceful: bool = True) -> None:
        host = self.hosts.pop(name)
        self.removed.append(host)
        if graceful:
            request_stop(host, "removed")
        else:  # like SIGKILL: no Leave, the coordinator must notice the silence
            host.port.stop()
            host.actor_ref.stop(block=False)
        host.done.wait(5.0)

    def wait(self, timeout_s: float) -> bool:
        """True when the coordinator finished the run within `timeout_s`."""
        return self.hosts["coordinator"].done.wait(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop every actor, then destroy the context. An actor still running `timeout_s` later keeps
        the context (closing a socket under a live thread aborts the whole process in libzmq): a
        RuntimeError names it instead."""
        for host in self.hosts.values():
            if not host.done.is_set():
                host.actor_ref.stop(block=False)
        deadline = time.monotonic() + timeout_s
        hosts = [*self.hosts.values(), *self.removed]
        running = [h.core.name for h in hosts if not h.done.wait(max(0.0, deadline - time.monotonic()))]
        if running:
            raise RuntimeError(f"{', '.join(running)} still running {timeout_s:g}s after close; zmq context left open")
        close_context(self.ctx)
