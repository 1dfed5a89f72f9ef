"""Hostile frames against a live run's sockets (tcp, CURVE): every bound actor keeps answering, every
member keeps heartbeating, and the run finishes its epochs with its invariants.

Most frames come from a peer holding a registered worker key (so they get past the handshake and
reach the decoder and the role checks); some from a plain socket and a few are over the size limit
(disconnected by ZeroMQ). The generator is tests/fuzzframes.py (seeded): random bytes, mutations,
wrong types and shapes, deep nesting, invalid UTF-8, huge length prefixes, extra frames, odd values.
"""

from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from prl_actors.config import Config
from prl_actors.launch.client import request
from prl_actors.launch.process import LocalCluster
from prl_actors.protocol import decode, encode
from prl_actors.protocol import messages as m
from prl_actors.transport.auth import KeyStore, create_keys
from tests import fuzzframes
from tests.conftest import assert_invariants, dealer, read_logs, sim_config, wait_for

SERVERS = ("coordinator", "publisher", "buffer")
WINDOW = 64  # frames in flight per socket (every frame that arrives is answered)


class Fuzzer:
    def __init__(self, ctx: zmq.Context, cfg: Config, seed: int) -> None:  # type: ignore[type-arg]
        create_keys(cfg.keys_path(), ["worker-fuzz"])
        self.cfg, self.rng = cfg, random.Random(seed)
        self.socks = {a: dealer(ctx, cfg, a, "worker-fuzz") for a in SERVERS}
        self.plain = {a: ctx.socket(zmq.DEALER) for a in SERVERS}
        for a, s in self.plain.items():
            s.setsockopt(zmq.LINGER, 0)
            s.connect(cfg.address(a))
        self.in_flight = dict.fromkeys(SERVERS, 0)
        self.sent = self.answered = 0

    def run(self, n: int) -> None:
        oversize = {n // 3, 2 * n // 3}
        for i in range(n):
            actor = self.rng.choice(SERVERS)
            if i in oversize:
                self._oversize(actor)
            elif self.rng.random() < 0.05:  # no handshake: ZeroMQ holds (then refuses) it, the actor never sees it
                with contextlib.suppress(zmq.Again):
                    self.plain[actor].send_multipart(fuzzframes.frames(self.rng), zmq.NOBLOCK)
            else:
                self._send(actor, fuzzframes.frames(self.rng))
        for actor in SERVERS:
            self._drain(actor, until=0)

    def _send(self, actor: str, frames: list[bytes]) -> None:
        self._drain(actor, until=WINDOW - 1)
        self.socks[actor].send_multipart(frames)
        self.in_flight[actor] += 1
        self.sent += 1

    def _drain(self, actor: str, until: int) -> None:
        sock = self.socks[actor]
        while self.in_flight[actor] > until and sock.poll(1000):
            sock.recv_multipart()
            self.in_flight[actor] -= 1
            self.answered += 1
        self.in_flight[actor] = min(self.in_flight[actor], until)  # a frame lost with a dropped connection

    def _oversize(self, actor: str) -> None:
        control, bulk = self.cfg.message_limits()
        size = (bulk if actor == "publisher" else control) + 1
        big = msgspec.msgpack.encode({"proto": m.PROTOCOL_VERSION, "type": "leave", "reason": "x" * size})
        self.socks[actor].send_multipart([big])  # ZeroMQ drops the connection; the DEALER reconnects
        self.in_flight[actor] = 0  # what was in flight may be lost with the connection


def probe(cfg: Config, fuzzer: Fuzzer) -> m.Status:
    """Every bound actor answers; the coordinator heard from every member within a second."""
    for actor in ("publisher", "buffer"):
        sock, probe = fuzzer.socks[actor], m.StatusRequest(sender="worker-fuzz")
        sock.send_multipart(encode(probe))
        reply = None
        while reply is None or getattr(reply, "reply_to", "") != probe.id:  # late answers to the fuzz first
            assert sock.poll(5000), f"{actor} is deaf after the fuzz"
            reply, _ = decode(sock.recv_multipart())
        assert isinstance(reply, m.Error) and reply.code == m.ErrorCode.UNEXPECTED
    st = request(cfg.address("coordinator"), m.StatusRequest(), timeout_s=5.0, keys=KeyStore(cfg.keys_path()))
    assert isinstance(st, m.Status)
    assert {x.name for x in st.members} >= {"publisher", "buffer", "trainer"}
    assert all(x.last_seen_s < 1.0 for x in st.members), st.members
    return st


def fuzz_live(run_dir: Path, frames: int, seed: int, epochs: int, gen_s: float) -> Fuzzer:
    cfg = sim_config(run_dir, transport="tcp", run__epochs=epochs, sim__gen_s_per_token=gen_s,
                     coordinator__heartbeat_timeout_s=2.0)  # fmt: skip
    cluster = LocalCluster(cfg, workers=2, log_dir=run_dir / "logs")
    ctx = zmq.Context()
    try:
        wait_for(run_dir, lambda e: e["event"] == "epoch_open" and e["actor"] == "coordinator")
        fuzzer = Fuzzer(ctx, cfg, seed)
        t0 = time.monotonic()
        fuzzer.run(frames)
        fuzz_s = time.monotonic() - t0
        probe(cfg, fuzzer)
        assert not cluster.hosts["coordinator"].done.is_set(), f"the run ended during the fuzz ({fuzz_s:.1f}s)"
        assert cluster.wait(120), "the run did not finish after the fuzz"
    finally:
        ctx.destroy(linger=0)
        cluster.close()
    assert_invariants(run_dir, epochs=epochs, groups=6)
    events = read_logs(run_dir)
    assert {e["worker"] for e in events if e["event"] == "train_group"} <= {"worker-0", "worker-1"}
    assert not [e for e in events if e["event"] in ("actor_crashed", "handler_error")]
    return fuzzer


def test_live_fuzz_small(run_dir: Path) -> None:
    fuzzer = fuzz_live(run_dir, frames=3000, seed=7, epochs=12, gen_s=0.02)  # ~1 s per epoch
    assert fuzzer.answered >= 0.9 * fuzzer.sent, (fuzzer.answered, fuzzer.sent)


@pytest.mark.slow
def test_live_fuzz_100k(run_dir: Path) -> None:
    fuzzer = fuzz_live(run_dir, frames=100_000, seed=12, epochs=30, gen_s=0.08)  # ~2 min: outlasts the fuzz
    assert fuzzer.answered >= 0.9 * fuzzer.sent, (fuzzer.answered, fuzzer.sent)
