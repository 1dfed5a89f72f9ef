"""Running the classic-RL run: the learner process, env actor processes, and `prl-actors up` for them.

    prl-actors up --config configs/cartpole.yaml
        -> prl-actors actor learner  (binds the learner address; PPO loop + the learner core)
        -> prl-actors actor env --name env-i   x env.actors  (connect to it; more may join any time)

`EnvRun` is the env runtime's plug-in of the one supervisor (launch/supervisor.py): it replaces an env actor
that crashed or was killed (its slots were already moved by the learner) and ends when the learner
exits; Ctrl-C (SIGTERM, SIGHUP) stops the learner, which shuts every env actor down.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from prl_actors.launch.supervisor import Interrupted, Supervisor, actor_argv
from prl_actors.launch.wiring import members
from prl_actors.records.logs import console
from prl_actors.records.rundir import RunDir
from prl_actors.runtime.processes import spawn, watch_supervisor
from prl_actors.runtime.threads import env_threads, set_torch_threads
from prl_actors.transport.auth import close_context, create_keys

if TYPE_CHECKING:
    from prl_actors.classic.envkit.settings import EnvSection
    from prl_actors.classic.envs.client import EnvClient
    from prl_actors.classic.learner_acting import LearnerSettings
    from prl_actors.config import Config
    from prl_actors.runtime.core import ActorHost
    from prl_actors.transport.auth import Security
    from prl_actors.transport.port import Limits

ENV_ROLES = ("learner", "env")
ENV_STOP_GRACE_S = 5.0  # an env actor's clean stop (Leave), the learner's after a stop signal


def env_section(cfg: Config) -> EnvSection:
    if cfg.env is None:
        raise ValueError("the config has no `env` section (see configs/cartpole.yaml)")
    return cfg.env


def env_transport(cfg: Config, name: str) -> tuple[Security | None, Limits]:
    """The CurveZMQ settings (None: transport.auth none, or inproc) and frame bounds of the env-plane
    actor `name` (the learner, or an env actor)."""
    from prl_actors.classic.envs import hub

    _, bulk = cfg.message_limits()
    return hub.env_transport(name, bulk, cfg.keys_path() if cfg.authenticated() else None)


def learner_settings(cfg: Config, mode: str | None = None) -> LearnerSettings:
    """The learner core's settings from the config (the spaces from one local env instance)."""
    import uuid

    from prl_actors.classic.envs.hub import obs_space
    from prl_actors.classic.learner_acting import LearnerSettings

    env = env_section(cfg)
    shape, dtype = obs_space(env.env_id)
    return LearnerSettings(
        run_id=f"{cfg.run.name}-{uuid.uuid4().hex[:8]}",
        mode=mode or env.mode,
        env_id=env.env_id,
        num_envs=env.num_envs,
        obs_shape=shape,
        obs_dtype=dtype,
        address=cfg.address("learner"),
        seed=cfg.run.seed,
        heartbeat_interval_s=cfg.coordinator.heartbeat_interval_s,
        heartbeat_timeout_s=cfg.coordinator.heartbeat_timeout_s,
        step_timeout_s=env.step_timeout_s,
        wait_actors=max(1, env.actors),
        wait_actors_s=env.wait_actors_s,
        steps_per_segment=env.ppo.num_steps,
        chunk_bytes=cfg.publisher.chunk_bytes,
        round_timeout_s=env.round_timeout_s,
    )


def env_client(cfg: Config, ctx: zmq.SyncContext | None = None, log_dir: Path | None = None) -> EnvClient:
    """The learner's `EnvClient` (remote mode): binds the learner address; env actors connect to it."""
    from prl_actors.classic.envs.client import EnvClient

    assert cfg.env is not None
    security, limits = env_transport(cfg, "learner")
    return EnvClient(learner_settings(cfg, mode="remote"), ctx, log_dir, cfg.env.call_timeout_s, security, limits)


def start_env(name: str, cfg: Config, ctx: zmq.SyncContext, log_dir: Path | None = None) -> ActorHost:
    """Build and start one env actor of the run (connects to the learner); returns its host."""
    from prl_actors.classic.env_actor import EnvActorSettings
    from prl_actors.classic.envs.hub import start_env_actor

    env = env_section(cfg)
    settings = EnvActorSettings(
        seed=cfg.run.seed,
        sync_kl_threshold=env.sync_kl_threshold,
        kl_obs_per_env=env.kl_obs_per_env,
        fetch_timeout_s=cfg.worker.weight_fetch_timeout_s,
        learner_timeout_s=env.learner_timeout_s,
    )
    security, limits = env_transport(cfg, name)
    heartbeat_s = cfg.coordinator.heartbeat_interval_s
    return start_env_actor(name, settings, ctx, cfg.address("learner"), heartbeat_s, security, limits, log_dir)


def run_learner(cfg: Config, quiet: bool = False) -> int:
    """The learner process: PPO against remote env actors until solved or out of steps."""
    assert cfg.env is not None
    set_torch_threads(env_threads(cfg.env))
    watch_supervisor(lambda: os.kill(os.getpid(), signal.SIGINT))  # `up` killed outright: stop as on Ctrl-C
    rd = RunDir(Path(cfg.run.run_dir))
    emit = _emitter(rd, quiet)
    if cfg.env.mode == "remote":
        from prl_actors.classic.envkit.ppo import train_vector

        envs = env_client(cfg, log_dir=rd.logs)
        try:
            result = train_vector(envs, cfg.env.ppo, cfg.run.seed, emit)
        finally:
            envs.close()
    else:
        from prl_actors.classic.envs.detach import train_acting
        from prl_actors.classic.envs.hub import Hub

        hub = Hub(learner_settings(cfg), None, rd.logs, *env_transport(cfg, "learner"))
        try:
            result = train_acting(hub, cfg.env, cfg.run.seed, emit)
        finally:
            hub.close("completed")
    console(final_line(result))
    if "agent" in result:  # the final policy, for use after the run
        from prl_actors.classic.envkit.ppo import save_policy

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
    from prl_actors.launch.process import serve_until_stopped

    if cfg.env is not None and cfg.env.mode == "acting":
        set_torch_threads(env_threads(cfg.env))
    ctx = zmq.Context()
    host = start_env(name, cfg, ctx, RunDir(Path(cfg.run.run_dir)).logs)
    try:
        stuck = serve_until_stopped(host, ENV_STOP_GRACE_S)
    finally:
        if host.done.is_set():  # a stuck actor keeps its sockets: closing them under it aborts in libzmq
            close_context(ctx)
    return 1 if host.error or stuck else 0


class EnvRun:
    """`prl-actors up` for a config with an `env` section: the env runtime as a plug-in of the one
    supervisor (process groups, stop signals, grace then SIGTERM then SIGKILL). It starts what the
    composition root says runs (wiring.members: the learner, then the env actors) and says what an
    exit means: the learner's ends the run with its exit code; an env
    actor that crashed or was killed is replaced at once under a new name (its slots were already
    moved by the learner); one that exits 0 was shut down. A stop signal: SIGINT to the learner, which
    shuts every env actor down; `up` exits 128 + the signal."""

    def __init__(self, cfg: Config, config_path: Path) -> None:
        assert cfg.env is not None
        self.cfg, self.config_path = cfg, config_path
        self.sup = Supervisor(ENV_STOP_GRACE_S)
        self.next_env = 0

    def spawn(self, name: str) -> None:
        cmd = actor_argv(name, self.config_path)
        self.sup.start(spawn(name, cmd))

    def add_env(self) -> str:
        name = f"env-{self.next_env}"
        self.next_env += 1
        if self.cfg.authenticated():  # its own key (RUN_DIR/keys, made by `up`): no env actor speaks as another
            create_keys(self.cfg.keys_path(), [name])
        self.spawn(name)
        return name

    def run(self) -> int:
        follower = None
        if self.cfg.run.report_to:  # run.report_to: one thread follows metrics.jsonl (prl_actors/records/tracking.py)
            from prl_actors.records.tracking import MetricsFollower

            config = self.cfg.model_dump(mode="json")
            follower = MetricsFollower(
                Path(self.cfg.run.run_dir), list(self.cfg.run.report_to), self.cfg.run.name, config
            )
            follower.start()
        with self.sup.signals.installed():
            try:
                for m in members(self.cfg):
                    if m.role == "env":
                        self.add_env()  # its key first
                    else:
                        self.spawn(m.name)
                return self._supervise()
            except Interrupted as sig:
                console(f"\n{sig}: stopping the learner and the env actors ...")
                self.sup.children["learner"].proc.send_signal(signal.SIGINT)
                return 128 + sig.signum
            finally:
                self.sup.reap()
                if follower is not None:
                    follower.stop()

    def _supervise(self) -> int:
        learner = self.sup.children["learner"]
        while (rc := learner.proc.poll()) is None:
            self.sup.signals.check()
            for name in [n for n in self.sup.children if n.startswith("env-")]:
                code = self.sup.children[name].proc.poll()
                if code is None:
                    continue
                del self.sup.children[name]
                if code != 0:
                    how = f"signal {-code}" if code < 0 else f"code {code}"
                    console(f"{name} exited ({how}); started {self.add_env()}")
            time.sleep(0.1)
        return rc
