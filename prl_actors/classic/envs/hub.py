"""Hosting the learner's actor core in the learner process, and calling into it from the main thread.

The main thread (a PPO loop) never touches the core's state: `Hub.call(fn)` queues `fn(now, done)` as
a `Deferred` item in the actor's inbox and blocks until the core calls `done(result)` (or the timeout
passes, which is an `EnvUnavailable` error with the reason). Env actors are started here too
(`start_env_actor`), in this process over inproc:// for tests, or one per OS process; launch/classic.py
composes their settings, addresses and keys from the run's config.

Trust (docs/SECURITY.md): on tcp/ipc the learner's ROUTER is a CurveZMQ server with the `learner` key
and every env actor a client with its own key (`env-N`, else the `env` role key) from the run's key
directory; the role checks of `Core.forbidden` and the hop table cover the env messages as any other.
Arrays and policy chunks share one socket per env actor, so its frames are bounded by `ENV_FRAME_BYTES`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

import pykka
import zmq

from prl_actors.classic.env_actor import EnvActorSettings, EnvCore
from prl_actors.classic.envkit.local import SlotEnvs, make_env
from prl_actors.classic.learner import LearnerCore
from prl_actors.classic.learner_acting import LearnerSettings
from prl_actors.records.logs import EventLog
from prl_actors.runtime.core import ActorHost, Deferred
from prl_actors.transport.auth import KeyStore, Security, close_context
from prl_actors.transport.port import Limits

ENV_FRAME_BYTES = 64 << 20  # largest frame on the env plane (a segment's obs array, a policy chunk)


def env_transport(name: str, bulk_bytes: int, keys_dir: Path | None) -> tuple[Security | None, Limits]:
    """The CurveZMQ settings (None: no key directory, i.e. transport.auth none, or inproc) and frame bounds
    of the env-plane actor `name` (the learner, or an env actor); `bulk_bytes`: the run's bulk frame bound."""
    limits = Limits(max_msg_bytes=max(bulk_bytes, ENV_FRAME_BYTES))
    if keys_dir is None:
        return None, limits
    security = Security(KeyStore(keys_dir), name)
    security.store.public("learner")  # a missing key file is a clear error here, not in the port thread
    return security, limits


class EnvUnavailable(RuntimeError):
    """A vector call could not finish (no env actor, or the learner core stopped)."""


def obs_space(env_id: str) -> tuple[tuple[int, ...], str]:
    """The observation shape and dtype of `env_id` (from one local env instance)."""
    probe = make_env(env_id)
    try:
        space = probe.observation_space
        return tuple(int(d) for d in space.shape), str(space.dtype)
    finally:
        probe.close()


class Hub:
    """The learner core running in this process (binds the learner address)."""

    def __init__(
        self,
        settings: LearnerSettings,
        ctx: zmq.SyncContext | None = None,
        log_dir: Path | None = None,
        security: Security | None = None,
        limits: Limits = Limits(),
    ) -> None:
        self.own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        log = EventLog("learner", "learner", (log_dir / "learner.jsonl") if log_dir else None)
        log("actor_start", pid=os.getpid(), host=socket.gethostname(), address=settings.address)
        self.core = LearnerCore("learner", log, settings)
        _ipc_dir(settings.address)
        ref = ActorHost.start(self.core, self.ctx, settings.address, {}, limits=limits, security=security)
        host = ref._actor_weakref()
        assert host is not None
        self.host: ActorHost = host
        self._started()

    def _started(self, timeout_s: float = 30.0) -> None:
        """Wait until the core runs; a port that cannot bind (address in use) is a clear error."""
        fut: Future[bool] = Future()
        with contextlib.suppress(pykka.ActorDeadError):
            self.host.actor_ref.tell(Deferred(lambda now: fut.set_result(True)))
        deadline = time.monotonic() + timeout_s
        while not fut.done() and not self.host.done.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.host.error or not fut.done():  # on_start records a failed bind before any inbox item runs
            raise EnvUnavailable(f"the learner cannot start: {self.host.error or 'no answer'}")

    def call(self, fn: Callable[[float, Callable[[Any], None]], None], timeout_s: float, what: str) -> Any:
        """Run `fn(now, done)` in the core's thread; return what it passes to `done`."""
        fut: Future[Any] = Future()

        def run(now: float) -> None:
            try:
                fn(now, fut.set_result)
            except Exception as exc:
                fut.set_exception(exc)

        self.tell(run)
        try:
            return fut.result(timeout_s)
        except FutureTimeout:
            raise EnvUnavailable(
                f"{what} did not finish within {timeout_s:g}s: no env actor answered "
                f"({len(self.core.live())} registered); is `prl-actors actor env` running?"
            ) from None

    def tell(self, fn: Callable[[float], None]) -> None:
        if self.host.done.is_set():
            raise EnvUnavailable(f"the learner core has stopped ({self.host.error or 'finished'})")
        self.host.actor_ref.tell(Deferred(fn))

    def close(self, reason: str = "finished", timeout_s: float = 5.0) -> None:
        if not self.host.done.is_set():
            self.tell(lambda now: self.core.finish(reason))
            self.host.done.wait(timeout_s)
        if self.own_ctx and self.host.done.is_set():  # never under a live core: libzmq would abort
            close_context(self.ctx)


def _ipc_dir(address: str) -> None:
    if address.startswith("ipc://"):
        Path(address.removeprefix("ipc://")).parent.mkdir(parents=True, exist_ok=True)


def start_env_actor(
    name: str,
    settings: EnvActorSettings,
    ctx: zmq.SyncContext,
    learner_address: str,
    heartbeat_s: float,
    security: Security | None = None,
    limits: Limits = Limits(),
    log_dir: Path | None = None,
) -> ActorHost:
    """Build and start one env actor (connects to the learner at `learner_address`); returns its host."""
    log = EventLog(name, "env", (log_dir / f"{name}.jsonl") if log_dir else None)
    log("actor_start", pid=os.getpid(), host=socket.gethostname(), address="")
    core = EnvCore(name, log, SlotEnvs(), settings)
    peers = {"learner": learner_address}
    ref = ActorHost.start(core, ctx, None, peers, heartbeat_s=heartbeat_s, limits=limits, security=security)
    host = ref._actor_weakref()
    assert host is not None
    return host
