"""Running the classic-RL run: the learner process, env actor processes, and `prl-actors up` for them.

    prl-actors up --config configs/cartpole.yaml
        -> prl-actors actor learner  (binds the learner address; PPO loop + the learner core)
        -> prl-actors actor env --name env-i   x env.actors  (connect to it; more may join any time)

The launcher replaces an env actor that crashed or was killed (its slots were already moved by the
learner) and ends when the learner exits; Ctrl-C stops the learner, which shuts every env actor down.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from prl_actors.config import Config
from prl_actors.logs import console
from prl_actors.rundir import RunDir
from prl_actors.transport.auth import close_context, create_keys

ENV_ROLES = ("learner", "env")


def _threads(cfg: Config) -> None:
    import torch

    assert cfg.env is not None
    torch.set_num_threads(cfg.env.threads)


def run_learner(cfg: Config, quiet: bool = False) -> int:
    """The learner process: PPO against remote env actors until solved or out of steps."""
    assert cfg.env is not None
    _threads(cfg)
    rd = RunDir(Path(cfg.run.run_dir))
    emit = _emitter(rd, quiet)
    if cfg.env.mode == "remote":
        from prl_actors.envs.client import EnvClient
        from prl_actors.envs.ppo import train_vector

        envs = EnvClient.from_config(cfg, log_dir=rd.logs)
        try:
            result = train_vector(envs, cfg.env.ppo, cfg.run.seed, emit)
        finally:
            envs.close()
    else:
        from prl_actors.envs.detach import train_acting
        from prl_actors.envs.hub import Hub, env_transport, learner_settings

        hub = Hub(learner_settings(cfg), None, rd.logs, *env_transport(cfg, "learner"))
        try:
            result = train_acting(hub, cfg, emit)
        finally:
            hub.close("completed")
    console(final_line(result))
    if "agent" in result:  # the final policy, for use after the run
        from prl_actors.envs.ppo import save_policy

        saved = save_policy(rd.root / "final", result["agent"], cfg.env.env_id, cfg.env.ppo.hidden)
        console(f"final policy: {saved}")
    return 0


def final_line(r: dict[str, Any]) -> str:
    state = "SOLVED" if r["solved"] else "not solved"
    return (
        f"{state}: mean return {r['return_mean']:.1f} over the last episodes after {r['steps']} env steps, "
        f"{r['updates']} updates, {r['wall_s']:.1f}s"
    )


def _emitter(rd: RunDir, quiet: bool) -> Any:
    def emit(row: dict[str, Any]) -> None:
        rd.epoch_metrics(row)
        if not quiet and (row["update"] % 10 == 0 or row["solved"]):
            extra = f"  fetches {row['weight_fetches']}" if "weight_fetches" in row else ""
            console(
                f"update {row['update']:>4}  steps {row['global_step']:>7}  return(100) {row['return_mean']}"
                f"  sps {row['sps']:.0f}{extra}"
            )

    return emit


def run_env_actor(name: str, cfg: Config) -> int:
    """One env actor until the learner shuts it down; SIGTERM/SIGINT: leave gracefully first."""
    from prl_actors.envs.hub import start_env_actor
    from prl_actors.process import _request_stop

    if cfg.env is not None and cfg.env.mode == "acting":
        _threads(cfg)
    ctx = zmq.Context()
    host = start_env_actor(name, cfg, ctx, RunDir(Path(cfg.run.run_dir)).logs)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        while not host.done.wait(0.1):
            if stop.is_set():
                _request_stop(host, "signal")
                host.done.wait(5.0)
                break
    finally:
        close_context(ctx)
    return 1 if host.error else 0


class EnvLauncher:
    """`prl-actors up` for a config with an `env` section."""

    def __init__(self, cfg: Config, config_path: Path) -> None:
        assert cfg.env is not None
        self.cfg, self.config_path = cfg, config_path
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.next_env = 0

    def spawn(self, role: str, name: str) -> None:
        cmd = [sys.executable, "-m", "cli.main", "actor", role, "--config", str(self.config_path), "--name", name]
        self.procs[name] = subprocess.Popen(cmd)

    def add_env(self) -> str:
        name = f"env-{self.next_env}"
        self.next_env += 1
        if self.cfg.authenticated():  # its own key (RUN_DIR/keys, made by `up`): no env actor speaks as another
            create_keys(self.cfg.keys_path(), [name])
        self.spawn("env", name)
        return name

    def run(self) -> int:
        follower = None
        if self.cfg.run.report_to:  # run.report_to: one thread follows metrics.jsonl (prl_actors/tracking.py)
            from prl_actors.tracking import MetricsFollower

            config = self.cfg.model_dump(mode="json")
            follower = MetricsFollower(
                Path(self.cfg.run.run_dir), list(self.cfg.run.report_to), self.cfg.run.name, config
            )
            follower.start()
        self.spawn("learner", "learner")
        assert self.cfg.env is not None
        for _ in range(self.cfg.env.actors):
            self.add_env()
        try:
            return self._supervise()
        except KeyboardInterrupt:
            console("\ninterrupted: stopping the learner and the env actors ...")
            self.procs["learner"].send_signal(signal.SIGINT)
            return 130
        finally:
            self._reap()
            if follower is not None:
                follower.stop()

    def _supervise(self) -> int:
        while True:
            rc = self.procs["learner"].poll()
            if rc is not None:
                return rc
            for name in [n for n in self.procs if n.startswith("env-")]:
                code = self.procs[name].poll()
                if code is None:
                    continue
                del self.procs[name]
                if code != 0:
                    how = f"signal {-code}" if code < 0 else f"code {code}"
                    console(f"{name} exited ({how}); started {self.add_env()}")
            time.sleep(0.1)

    def _reap(self) -> None:
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs.values()):
            time.sleep(0.05)
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
