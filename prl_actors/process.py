"""Running actors: one per OS process (`prl-actors actor`), or all in one process (tests, benchmarks)."""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

import pykka
import zmq

from prl_actors.actors.runtime import ActorHost, StopRequest
from prl_actors.config import Config
from prl_actors.topology import ensure_key, role_of, start_actor
from prl_actors.transport.auth import close_context, create_keys, run_key_names


class ActorFailed(Exception):
    pass


def run_actor_process(name: str, cfg: Config, quiet: bool = False) -> int:
    """Run one actor until it stops. SIGTERM/SIGINT: a worker leaves gracefully, others just stop."""
    _limit_threads(name, cfg)
    ctx = zmq.Context()
    host = start_actor(name, cfg, ctx, Path(cfg.run.run_dir) / "logs", quiet=quiet)
    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        while not host.done.wait(0.1):
            if stop.is_set() or host.error:  # error: the port thread died; the actor is stopping
                _request_stop(host, "signal")
                host.done.wait(5.0)
                break
    finally:
        close_context(ctx)
    if host.error:
        raise ActorFailed(f"{name}: {host.error}")
    return 0


def _limit_threads(name: str, cfg: Config) -> None:
    """One process per actor: give torch the configured threads, not every core (oversubscription)."""
    role = role_of(name)
    if cfg.worker.engine == "sim" or role not in ("worker", "trainer"):
        return
    import torch

    torch.set_num_threads(cfg.worker.threads if role == "worker" else cfg.trainer.threads)


def _request_stop(host: ActorHost, reason: str) -> None:
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
        self._next_worker = 0
        for name in ("coordinator", "publisher", "buffer", "trainer"):
            self.hosts[name] = start_actor(name, cfg, self.ctx, log_dir, quiet=True)
        for _ in range(cfg.run.workers if workers is None else workers):
            self.add_worker()

    def add_worker(self) -> str:
        name = f"worker-{self._next_worker}"
        self._next_worker += 1
        ensure_key(name, self.cfg)
        self.hosts[name] = start_actor(name, self.cfg, self.ctx, self.log_dir, quiet=True)
        return name

    def remove_worker(self, name: str, graceful: bool = True) -> None:
        host = self.hosts.pop(name)
        if graceful:
            _request_stop(host, "removed")
        else:  # like SIGKILL: no Leave, the coordinator must notice the silence
            host.port.stop()
            host.actor_ref.stop(block=False)
        host.done.wait(5.0)

    def wait(self, timeout_s: float) -> bool:
        """True when the coordinator finished the run within `timeout_s`."""
        return self.hosts["coordinator"].done.wait(timeout_s)

    def close(self) -> None:
        for host in self.hosts.values():
            if not host.done.is_set():
                host.actor_ref.stop(block=False)
        for host in self.hosts.values():
            host.done.wait(5.0)
        close_context(self.ctx)
