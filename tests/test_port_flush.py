"""Port.flush: the port thread acknowledges that it routed what the calling thread queued (an
actor's stop waits for this instead of sleeping), and a stop with linger lets libzmq send it."""

from __future__ import annotations

import threading
import time

import zmq

from prl_actors.protocol.messages import Ack, Msg
from prl_actors.transport.port import Dest, Inbound, Port

N = 2000


def test_every_message_queued_before_a_flush_reaches_the_peer_after_stop() -> None:
    ctx = zmq.Context()
    got: list[Inbound[Msg]] = []
    all_in = threading.Event()

    def received(inbound: Inbound[Msg]) -> None:
        got.append(inbound)
        if len(got) == N:
            all_in.set()

    server = Port(ctx, "server", "inproc://flush-server", {}, on_message=received, on_bad_frame=lambda b: None)
    client = Port(ctx, "client", None, {"server": "inproc://flush-server"}, on_message=lambda m: None,
                  on_bad_frame=lambda b: None)  # fmt: skip
    server.start()
    client.start()
    try:
        for i in range(N):
            client.send(Dest.peer("server"), Ack(reply_to=str(i)))
        t0 = time.monotonic()
        assert client.flush(5.0)  # routed: acknowledged by the port thread, not guessed by a sleep
        assert time.monotonic() - t0 < 5.0
        client.stop(linger_ms=2000)  # the port thread is gone; libzmq still delivers what it routed
        assert all_in.wait(10.0), len(got)
        assert [m.msg.reply_to for m in got if isinstance(m.msg, Ack)] == [str(i) for i in range(N)]  # in order
    finally:
        client.stop()
        server.stop()
        ctx.destroy(linger=0)


def test_a_flush_without_a_port_thread_returns_at_once() -> None:
    ctx = zmq.Context()
    try:
        idle = Port(ctx, "idle", None, {}, on_message=lambda m: None, on_bad_frame=lambda b: None)
        t0 = time.monotonic()
        assert not idle.flush(5.0)  # never started: nothing to wait for
        assert time.monotonic() - t0 < 1.0
    finally:
        ctx.destroy(linger=0)
