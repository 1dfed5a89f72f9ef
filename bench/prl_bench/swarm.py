"""Many simulated members in one OS process: N DEALER sockets speaking the real protocol to a
coordinator (the control-plane benchmark's load generator). Driven over a multiprocessing Pipe.

Each member is a DEALER whose routing id is its name, so the coordinator sees N distinct members;
with a key directory every socket is a CurveZMQ client (members share the `worker` role key, the
buffer and publisher sockets use theirs), as in a run. Frames are encoded once per member and re-sent
(the coordinator does not deduplicate heartbeats), so the generator spends its time on sockets, not on
encoding.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import zmq

from prl_actors.protocol.codec import decode, encode
from prl_actors.protocol.messages import (
    Ack,
    EpochOpen,
    Heartbeat,
    HeartbeatAck,
    Leave,
    Register,
    Role,
    WeightsAvailable,
    WorkAssign,
    WorkRequest,
)
from prl_bench.common import percentile


class Swarm:
    def __init__(self, addr: str, keys: str | None = None) -> None:
        from prl_actors.transport.auth import KeyStore

        self.addr = addr
        self.keys = KeyStore(Path(keys)) if keys else None
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, 8192)
        self.members: list[zmq.Socket] = []
        self.names: list[str] = []
        self.buffer = self._socket("buffer")
        self.publisher = self._socket("publisher")
        self.prober = self._socket("worker-probe")

    def _socket(self, name: str, immediate: bool = False) -> zmq.Socket:
        from prl_actors.transport.auth import Security

        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.ROUTING_ID, name.encode())
        s.setsockopt(zmq.IMMEDIATE, int(immediate))
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
        if self.keys is not None:
            Security(self.keys, name).connect(s, "coordinator")
        s.connect(self.addr)
        return s

    # --- setup -------------------------------------------------------------------------------

    def open_epoch(self) -> dict[str, float]:
        """Play the buffer and the publisher: register, announce v0, ack EpochOpen; register the prober."""
        self._request(self.buffer, Register(role=Role.BUFFER, sender="buffer"))
        self.publisher.send_multipart(encode(WeightsAvailable(version=0, sender="publisher")))
        while True:
            msg, _ = decode(self.buffer.recv_multipart())
            if isinstance(msg, EpochOpen):
                self.buffer.send_multipart(encode(Ack(reply_to=msg.id, sender="buffer")))
                break
        self._request(self.prober, Register(role=Role.WORKER, sender="worker-probe"))
        return {}

    def join(self, n: int) -> dict[str, float]:
        """n new members connect (`connect_s`: until every handshake is done, CurveZMQ's cost), then
        register at once (`join_s`: until every Welcome is back). Split, because a member that waits
        for 999 others' handshakes before its first heartbeat would look dead to the coordinator."""
        start = len(self.members)
        t0 = time.monotonic()
        new: list[zmq.Socket] = []
        for first in range(start, start + n, 50):  # in batches, so handshakes interleave with heartbeats
            batch = [self._socket(f"worker-{i}", immediate=True) for i in range(first, min(first + 50, start + n))]
            self._wait_connected(batch)
            new += batch
        t1 = time.monotonic()
        self.names += [f"worker-{i}" for i in range(start, start + n)]
        for s, name in zip(new, self.names[start:], strict=True):
            s.send_multipart(encode(Register(role=Role.WORKER, sender=name)))
        self.members += new
        self._drain_replies(new, 1, "welcome")
        return {"members": float(len(self.members)), "connect_s": t1 - t0, "join_s": time.monotonic() - t1}

    def _wait_connected(self, socks: list[zmq.Socket], timeout_s: float = 120.0) -> None:
        """With ZMQ_IMMEDIATE a DEALER is writable only once its connection (handshake) is complete.
        Meanwhile the members that already joined keep heartbeating, as real ones would."""
        deadline = time.monotonic() + timeout_s
        beat = 0.0
        for s in socks:
            while not s.poll(20, zmq.POLLOUT):
                if time.monotonic() > deadline:
                    raise TimeoutError("members did not finish connecting")
                if time.monotonic() - beat > 0.2:
                    beat = time.monotonic()
                    for member, frames in zip(*self._heartbeaters(), strict=True):
                        member.send_multipart(frames)
                    self._settle(0.0)

    def leave(self) -> dict[str, float]:
        t0 = time.monotonic()
        for s, name in zip(self.members, self.names, strict=True):
            s.send_multipart(encode(Leave(reason="bench", sender=name)))
        self._drain_replies(self.members, 1, "ack")
        out = {"left": float(len(self.members)), "leave_s": time.monotonic() - t0}
        for s in self.members:
            s.close(linger=0)
        self.members, self.names = [], []
        return out

    def _request(self, sock: zmq.Socket, msg: Any) -> Any:
        sock.send_multipart(encode(msg))
        if not sock.poll(10_000):
            raise TimeoutError(f"no reply to {msg.__struct_config__.tag}")
        return decode(sock.recv_multipart())[0]

    def _drain_replies(self, socks: list[zmq.Socket], each: int, tag: str, timeout_s: float = 60.0) -> None:
        """Wait until every socket got `each` replies tagged `tag` (other messages are skipped)."""
        left = {s: each for s in socks}
        poller = zmq.Poller()
        for s in socks:
            poller.register(s, zmq.POLLIN)
        deadline = time.monotonic() + timeout_s
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(left)} members got no {tag} in {timeout_s}s")
            for s, _ in poller.poll(100):
                while left.get(s, 0) and s.poll(0):
                    if decode(s.recv_multipart())[0].__struct_config__.tag == tag:
                        left[s] -= 1
                        if not left[s]:
                            del left[s]
                            poller.unregister(s)

    # --- load --------------------------------------------------------------------------------

    def flood(self, seconds: float, window: int) -> dict[str, float]:
        """Every member keeps `window` heartbeats in flight; replies/s = messages/s handled."""
        socks, frames = self._heartbeaters()
        poller = zmq.Poller()
        for s, f in zip(socks, frames, strict=True):
            poller.register(s, zmq.POLLIN)
            for _ in range(window):
                s.send_multipart(f)
        index = {s: i for i, s in enumerate(socks)}
        replies, t0, c0 = 0, time.monotonic(), time.process_time()
        while time.monotonic() - t0 < seconds:
            for s, _ in poller.poll(100):
                while s.poll(0):
                    s.recv_multipart(copy=False)
                    replies += 1
                    s.send_multipart(frames[index[s]])
        elapsed = time.monotonic() - t0
        cpu = (time.process_time() - c0) / elapsed
        self._settle()
        return {"replies": float(replies), "seconds": elapsed, "msgs_per_s": replies / elapsed, "client_cpu": cpu}

    def _heartbeaters(self) -> tuple[list[zmq.Socket], list[list[Any]]]:
        """Every member, plus the buffer and the prober (silent ones would be timed out)."""
        socks = [*self.members, self.buffer, self.prober]
        names = [*self.names, "buffer", "worker-probe"]
        return socks, [encode(Heartbeat(sender=name, version=0)) for name in names]

    def _settle(self, quiet_s: float = 0.3) -> None:
        """Read until nothing arrives for `quiet_s` (in-flight replies of a flood)."""
        poller = zmq.Poller()
        for s in self._heartbeaters()[0]:
            poller.register(s, zmq.POLLIN)
        while True:
            ready = poller.poll(int(quiet_s * 1000))
            if not ready:
                return
            for s, _ in ready:
                while s.poll(0):
                    s.recv_multipart(copy=False)

    def steady(self, seconds: float, interval_s: float, probe_every_s: float) -> dict[str, Any]:
        """Heartbeats at `interval_s` from every member (spread evenly), and the prober asks for work
        every `probe_every_s`: round-trip times of both, and how many acks said `known=False`. Only the
        reply to the probe in flight counts (a late one of an earlier phase carries no start time)."""
        socks, frames = self._heartbeaters()
        n = len(socks)
        sent_at: dict[int, float] = {}
        hb_rtt, assign_rtt, unknown = [], [], 0
        poller = zmq.Poller()
        for s in socks:
            poller.register(s, zmq.POLLIN)
        index = {s: i for i, s in enumerate(socks)}
        t0 = time.monotonic()
        next_hb, next_probe, k = t0, t0, 0
        probe_t, probe_id = 0.0, ""
        while (now := time.monotonic()) - t0 < seconds:
            while now >= next_hb:  # member k's turn: n heartbeats per interval, evenly spaced
                i = k % n
                if i not in sent_at:
                    socks[i].send_multipart(frames[i])
                    sent_at[i] = now
                k += 1
                next_hb += interval_s / n
            if not probe_t and now >= next_probe:
                probe = WorkRequest(sender="worker-probe", epoch=0, version=0)
                self.prober.send_multipart(encode(probe))
                probe_t, probe_id, next_probe = now, probe.id, now + probe_every_s
            for s, _ in poller.poll(max(0, int((min(next_hb, next_probe) - time.monotonic()) * 1000))):
                while s.poll(0):
                    msg = decode(s.recv_multipart())[0]
                    t = time.monotonic()
                    if s is self.prober and isinstance(msg, WorkAssign) and msg.reply_to == probe_id:
                        assign_rtt.append(t - probe_t)
                        probe_t = 0.0
                    elif isinstance(msg, HeartbeatAck):
                        hb_rtt.append(t - sent_at.pop(index[s], t))
                        unknown += not msg.known
        return {
            "heartbeats": len(hb_rtt),
            "hb_per_s": len(hb_rtt) / seconds,
            "hb_rtt_p50_ms": 1e3 * percentile(hb_rtt, 50),
            "hb_rtt_p99_ms": 1e3 * percentile(hb_rtt, 99),
            "unknown_acks": unknown,
            "assignments": len(assign_rtt),
            "assign_p50_ms": 1e3 * percentile(assign_rtt, 50),
            "assign_p99_ms": 1e3 * percentile(assign_rtt, 99),
        }

    def close(self) -> None:
        self.ctx.destroy(linger=0)


def serve(conn: Connection) -> None:
    """Process entry point: ("start", addr) then method calls ("join", n), ("flood", s, w), ..."""
    swarm: Swarm | None = None
    while True:
        cmd = conn.recv()
        try:
            if cmd[0] == "exit":
                break
            if cmd[0] == "start":
                if swarm is not None:
                    swarm.close()
                swarm = Swarm(*cmd[1:])
                reply: Any = {}
            else:
                assert swarm is not None, "start first"
                reply = getattr(swarm, cmd[0])(*cmd[1:])
        except Exception as exc:  # reported to the parent, which raises it
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        conn.send(reply)
    if swarm is not None:
        swarm.close()
