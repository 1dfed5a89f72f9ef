"""Helpers for the classic-RL tests: an env config, env actors in this process (inproc), and a kill."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zmq

from prl_actors.config import Config, load_config
from prl_actors.launch.classic import start_env
from prl_actors.runtime.core import ActorHost
from tests.conftest import port_base


def env_config(run_dir: Path, transport: str = "inproc", **env: Any) -> Config:
    """A small env run; `env` overrides fields of the env section (ppo=dict(...) for PPO's)."""
    section: dict[str, Any] = {"mode": "remote", "actors": 2, "num_envs": 5, "wait_actors_s": 5.0}
    section.update(env)
    return load_config(
        None,
        {
            "run.name": f"e{port_base()}",
            "run.run_dir": str(run_dir),
            "run.seed": 3,
            "transport.kind": transport,
            "transport.base_port": port_base(),
            "coordinator.heartbeat_interval_s": 0.05,
            "coordinator.heartbeat_timeout_s": 0.6,
            "env": section,
        },
    )


class EnvActors:
    """Env actors in this process (they connect to the learner over the config's transport)."""

    def __init__(self, cfg: Config, ctx: zmq.Context, n: int) -> None:  # type: ignore[type-arg]
        self.cfg, self.ctx = cfg, ctx
        self.hosts: dict[str, ActorHost] = {}
        self.log_dir = Path(cfg.run.run_dir) / "logs"
        for i in range(n):
            self.add(f"env-{i}")

    def add(self, name: str) -> None:
        self.hosts[name] = start_env(name, self.cfg, self.ctx, self.log_dir)

    def kill(self, name: str) -> None:
        """Like SIGKILL: no Leave; the learner must notice the silence."""
        host = self.hosts.pop(name)
        host.port.stop()
        host.actor_ref.stop(block=False)
        host.done.wait(5.0)

    def close(self) -> None:
        for host in self.hosts.values():
            host.done.wait(5.0)
            if not host.done.is_set():
                host.actor_ref.stop(block=False)
                host.done.wait(5.0)
        running = [name for name, host in self.hosts.items() if not host.done.is_set()]
        # raised before the caller destroys the context: closing a live actor's sockets aborts in libzmq
        assert not running, f"env actors still running after close: {running}"
