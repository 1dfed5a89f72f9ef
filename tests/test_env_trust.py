"""The env plane (learner <-> env actors, docs/ENVS.md) under the same trust rules as the LLM run's
actors: on tcp the learner is a CurveZMQ server, a peer without a registered key gets nothing, and a
key holder may send only what its role may send, under names its key covers (docs/SECURITY.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from prl_actors.classic.envs.client import EnvClient
from prl_actors.launch.classic import env_client
from prl_actors.protocol import decode, encode
from prl_actors.protocol import messages as m
from prl_actors.transport.auth import close_context, create_keys, run_key_names
from tests.conftest import dealer
from tests.env_utils import EnvActors, env_config


def _ask(sock: zmq.Socket, msg: m.Msg, timeout_s: float = 1.5) -> m.Msg | None:  # type: ignore[type-arg]
    sock.send_multipart(encode(msg))
    if not sock.poll(int(timeout_s * 1000)):
        return None
    return decode(sock.recv_multipart())[0]


def _counters(envs: EnvClient) -> dict[str, int]:
    return dict(envs.hub.call(lambda now, done: done(dict(envs.hub.core.counters)), 5.0, "counters"))


def _forbidden(reply: m.Msg | None, why: str) -> bool:
    return isinstance(reply, m.Error) and reply.code == m.ErrorCode.FORBIDDEN and why in reply.detail


def test_the_learner_refuses_strangers_and_impostors_and_keeps_stepping(run_dir: Path) -> None:
    cfg = env_config(run_dir, transport="tcp", num_envs=4, wait_actors_s=20.0)
    assert cfg.authenticated()
    create_keys(cfg.keys_path(), [*run_key_names(), "env-0", "env-1", "env-evil"])  # as `up` (+ a leaked key)
    ctx, attack = zmq.Context(), zmq.Context()
    envs = env_client(cfg, ctx=ctx, log_dir=run_dir / "logs")
    actors = EnvActors(cfg, ctx, 2)
    try:
        envs.reset(seed=0)
        outsider = attack.socket(zmq.DEALER)
        outsider.setsockopt(zmq.LINGER, 0)
        outsider.connect(cfg.address("learner"))
        assert _ask(outsider, m.Register(role=m.Role.ENV, sender="env-x")) is None  # no handshake, no answer
        evil = dealer(attack, cfg, "learner", "env-evil")
        impostor = _ask(evil, m.Register(role=m.Role.ENV, sender="env-0"))
        assert _forbidden(impostor, "is not a name the key 'env-evil' may use"), impostor
        as_learner = _ask(evil, m.Register(role=m.Role.LEARNER, sender="env-evil"))
        assert _forbidden(as_learner, "may register only as a env"), as_learner
        worker = dealer(attack, cfg, "learner", "worker-x", key="worker")
        wrong_role = _ask(worker, m.Register(role=m.Role.WORKER, sender="worker-x"))
        assert _forbidden(wrong_role, "accepted only from env"), wrong_role
        for _ in range(20):  # the run goes on with its own env actors only
            envs.step(np.zeros(4, dtype=np.int64))
        assert set(envs.hub.core.slots.owner) == {"env-0", "env-1"}  # owner per slot
        counters = _wait_counted(envs, "auth_refused")
        assert counters["refused.forbidden"] == 3, counters
    finally:
        envs.close()
        actors.close()
        close_context(attack)
        close_context(ctx)


def _wait_counted(envs: EnvClient, key: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The learner's counters once `key` was counted (a refused handshake is reported asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while (counters := _counters(envs)).get(key, 0) < 1:
        assert time.monotonic() < deadline, f"the learner never counted {key}: {counters}"
        time.sleep(0.1)
    return counters
