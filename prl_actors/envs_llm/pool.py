"""Environment and tool steps run on daemon threads: a step that never returns can delay nothing
but its own episode, and never the process's exit.

concurrent.futures.ThreadPoolExecutor joins its (non-daemon) threads at interpreter exit, so one
hung `env.step` or tool kept a stopped worker process alive until it was SIGKILLed. This pool has
the same `submit -> Future` contract (the futures work with concurrent.futures.wait), with daemon
threads; `shutdown` cancels what has not started and lets running steps go.
"""

from __future__ import annotations

import concurrent.futures as cf
import queue
import threading
from collections.abc import Callable
from typing import Any

_Job = tuple[cf.Future[Any], Callable[..., Any], tuple[Any, ...]] | None


class DaemonPool:
    """Up to `threads` daemon threads taking jobs in submission order (started as jobs arrive)."""

    def __init__(self, threads: int, name: str) -> None:
        self.size, self.name = threads, name
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.idle = 0
        self.lock = threading.Lock()
        self.closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future[Any]:
        future: cf.Future[Any] = cf.Future()
        with self.lock:
            if self.closed:
                raise RuntimeError("the pool is shut down")
            if self.idle == 0 and len(self.threads) < self.size:
                thread = threading.Thread(target=self._run, name=f"{self.name}-{len(self.threads)}", daemon=True)
                self.threads.append(thread)
                thread.start()
            else:
                self.idle = max(0, self.idle - 1)
        self.jobs.put((future, fn, args))
        return future

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            future, fn, args = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                    future.set_exception(exc)
            with self.lock:
                self.idle += 1

    def shutdown(self) -> None:
        """Cancel the jobs not started; the threads end after their current step (or never, if it
        hangs: they are daemons)."""
        with self.lock:
            self.closed = True
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in self.threads:
            self.jobs.put(None)
