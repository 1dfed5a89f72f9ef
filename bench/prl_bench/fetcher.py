"""The worker side of the weight-sync benchmark: one OS process per simulated inference worker.

Each process hosts the real `WorkerCore` in the real `ActorHost` (a Port thread + a pykka actor),
with a stub engine, so a fetch runs exactly the worker's code: FetchWeights -> WeightsBegin, chunks
(assembled into one buffer by `Assembler`), WeightsEnd -> `unpack` -> `engine.load_weights`; or, on
the same host, FetchWeights(host_proof) -> WeightsBegin(shm_path) -> the validated mapping -> `unpack`
-> `engine.load_weights` (which then copies, as a real engine does).
The parent drives the processes over a multiprocessing Pipe with small commands (see `serve`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from prl_bench import internals

DEAD_ADDR = {"tcp": "tcp://127.0.0.1:1", "ipc": "ipc:///nonexistent/prl-bench-none"}


class IdleEngine:
    """The streaming engine protocol of an engine that only takes weights: never busy, never generates."""

    max_rows, rows, busy = 1, 0, False

    def admit(self, prompts: list, group_size: int) -> None:  # type: ignore[type-arg]
        pass

    def step(self) -> list:  # type: ignore[type-arg]
        return []

    def abort(self) -> list[int]:
        return []

    def generate(self, prompts: list, group_size: int) -> list:  # type: ignore[type-arg]
        return []

    def close(self) -> None:
        pass


class StubEngine(IdleEngine):
    """Records when weights arrive. With `copy`, copies every tensor into memory it keeps (allocated
    at the first load, as an engine's parameters exist before an update), as load_state_dict does;
    with `view`, keeps the given tensors as its parameters and reads every byte once, as the torch
    engine on CPU does now (no copy) followed by the first forward that reads every weight (the page
    faults of a fresh mapping are paid there); with neither, holds nothing (memory stays flat)."""

    def __init__(self, copy: bool = False, view: bool = False) -> None:
        self.version = -1
        self.loaded = threading.Event()
        self.t_loaded = 0.0
        self.nbytes = 0
        self.copy, self.view = copy, view
        self.params: dict[str, np.ndarray] = {}

    def load_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        if self.view:
            self.params = {name: np.asarray(t) for name, t in tensors.items()}
            for a in self.params.values():
                flat = a.reshape(-1)
                flat[: flat.nbytes // 4 * 4 // a.itemsize].view(np.float32).sum(dtype=np.float64)
        elif self.copy:
            for name, t in tensors.items():
                src = np.asarray(t)
                dst = self.params.get(name)
                if dst is None or dst.shape != src.shape:
                    dst = self.params[name] = np.ones_like(src)  # touched: not a first-touch cost later
                np.copyto(dst, src)
        self.t_loaded = time.monotonic()
        self.nbytes = sum(int(np.asarray(t).nbytes) for t in tensors.values())
        self.version = -1  # every fetch is a fresh one
        self.loaded.set()


class FetchWorker:
    """A WorkerCore in an ActorHost, connected to the publisher at `addr`; with `shm_run_id` it proves
    its host and takes the publisher's shared-memory snapshot (its engine keeps views and reads every
    weight once, see StubEngine)."""

    def __init__(self, name: str, kind: str, addr: str, shm_run_id: str = "") -> None:
        import zmq

        self.name, self.engine = name, StubEngine(view=bool(shm_run_id))
        self.ctx = zmq.Context()
        self.core = internals.worker_core(name, self.engine, shm_run_id)
        peers = {"coordinator": DEAD_ADDR[kind], "publisher": addr, "buffer": DEAD_ADDR[kind]}
        self.host = internals.start_host(self.core, self.ctx, None, peers)

    def fetch(self, timeout_s: float) -> dict[str, float]:
        self.engine.loaded.clear()
        t0 = time.monotonic()
        internals.send(self.host, "publisher", internals.fetch_request(self.core))
        if not self.engine.loaded.wait(timeout_s):
            raise TimeoutError(f"{self.name}: no weights within {timeout_s}s")
        return {"t_start": t0, "t_end": self.engine.t_loaded, "bytes": float(self.engine.nbytes)}

    def close(self) -> None:
        internals.stop_host(self.host, 5.0)
        self.ctx.destroy(linger=0)


def raw_receive(addr: str, nbytes: int) -> dict[str, float]:
    """Raw ZeroMQ: a DEALER says hello, then counts the bytes of the frames it gets (no copy)."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVHWM, 0)
    try:
        sock.connect(addr)
        sock.send(b"hi")
        got = 0
        while got < nbytes:
            got += len(sock.recv(copy=False).buffer)
        return {"t_end": time.monotonic(), "bytes": float(got)}
    finally:
        sock.close(linger=0)
        ctx.term()


def torch_unpack_s(nbytes: int) -> float:
    """What `unpack(..., as_torch=True)` costs on top (it copies every tensor into a new bytearray)."""
    import torch  # noqa: F401 - imported before the clock starts

    from prl_actors.protocol.messages import TensorMeta
    from prl_actors.weights.tensors import unpack

    n = nbytes // 4
    per = max(1, n // 16)
    metas = [TensorMeta(name=f"t{i}", dtype="float32", shape=[per], nbytes=per * 4) for i in range(n // per)]
    buf = bytearray(sum(m.nbytes for m in metas))
    t0 = time.perf_counter()
    unpack(metas, buf, as_torch=True)
    return time.perf_counter() - t0


def serve(conn: Connection, name: str) -> None:
    """Process entry point: answer commands until ("exit",). Replies are dicts (or an error)."""
    worker: FetchWorker | None = None
    while True:
        cmd = conn.recv()
        try:
            if cmd[0] == "exit":
                break
            if cmd[0] == "prepare":
                if worker is not None:
                    worker.close()
                worker = FetchWorker(f"worker-{name}", cmd[1], cmd[2], cmd[3] if len(cmd) > 3 else "")
                reply: Any = {"pid": os.getpid()}
            elif cmd[0] == "fetch":
                assert worker is not None, "prepare first"
                reply = worker.fetch(cmd[1])
            elif cmd[0] == "raw":
                reply = raw_receive(cmd[1], cmd[2])
            elif cmd[0] == "torch_unpack":
                reply = {"seconds": torch_unpack_s(cmd[1])}
            else:
                reply = {"error": f"unknown command {cmd[0]!r}"}
        except Exception as exc:  # reported to the parent, which fails the benchmark with it
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        conn.send(reply)
    if worker is not None:
        worker.close()
