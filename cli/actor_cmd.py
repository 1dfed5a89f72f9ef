"""`prl-actors actor ROLE`: one actor in this process (what compose services and remote hosts run).
Imports only typer at module level."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from prl_actors.cli.common import ConfigOpt, CoordOpt, KeysOpt, SetOpt, _config, fail


def actor(
    role: Annotated[str, typer.Argument(help="coordinator, publisher, buffer, trainer, worker; learner or env.")],
    config: ConfigOpt = None,
    name: Annotated[
        str | None, typer.Option(help="Unique actor name (default: the role; worker-<host>-<pid>).")
    ] = None,
    coordinator: CoordOpt = None,
    keys: KeysOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run one actor in this process (what compose services and remote hosts run).

    Under torchrun (RANK set) with trainer.strategy ddp or fsdp2, `actor trainer` is one rank of the
    trainer group: RANK 0 runs the trainer actor, the others follow it (docs/DISTRIBUTED.md).

    It authenticates with its own key (or its role's) from --keys (default RUN_DIR/keys). Its process
    title is `prl-actors NAME (run RUN)` (`ps`; `top` shows `prl-NAME`: docs/DEBUGGING.md).
    """
    from prl_actors.launch.topology import PEERS

    if role not in (*PEERS, "learner", "env"):
        fail(f"unknown role {role!r}; expected one of {', '.join((*PEERS, 'learner', 'env'))}")
    extra: dict[str, Any] = {}
    if coordinator:
        extra["transport.addresses.coordinator"] = coordinator
    if keys:
        extra["transport.keys_dir"] = str(keys)
    cfg = _config(config, set_, extra)
    if role in ("learner", "env"):
        _env_actor(role, name, cfg)
    if role == "trainer":
        _trainer_rank(cfg)
    name = _actor_name(role, name)
    from prl_actors.launch.proctitle import set_title
    from prl_actors.launch.supervisor import STANDBY_ENV

    set_title(f"spare-{name}" if os.environ.get(STANDBY_ENV) else name, cfg.run.name)  # a spare: run.standby_core
    if coordinator and role in ("worker", "trainer"):
        _discover(cfg, coordinator, name)
    if role == "coordinator":
        _claim_run_dir(cfg)
    from prl_actors.launch.process import SUPERVISOR_ENV, ActorFailed, exit_now, run_actor_process
    from prl_actors.sections import ConfigError
    from prl_actors.transport.auth import KeysError

    narrating = None
    if role == "worker" and not os.environ.get(SUPERVISOR_ENV):  # joined by hand: say what it does
        from prl_actors.cli import narrate

        narrating = narrate.start(Path(cfg.run.run_dir) / "logs" / f"{name}.jsonl", name)
    try:
        code = run_actor_process(name, cfg)
    except (ActorFailed, ConfigError, KeysError) as exc:  # ConfigError: e.g. a bad prompts file, found loading the task
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        code = 1
    if narrating is not None:
        narrating[0].set()
        narrating[1].join(timeout=2.0)
    exit_now(code)  # no waiting on a stuck thread or on slow finalizers


def _env_actor(role: str, name: str | None, cfg: Any) -> None:
    """The classic-RL roles: the learner process, or one env actor (it connects to the learner)."""
    if cfg.env is None:
        fail("the learner and env roles need a config with an `env` section (see configs/cartpole.yaml)")
    name = _actor_name(role, name)
    from prl_actors.launch.proctitle import set_title

    set_title(name, cfg.run.name)
    from prl_actors.classic.envs.hub import EnvUnavailable
    from prl_actors.launch.classic import run_env_actor, run_learner
    from prl_actors.transport.auth import KeysError

    try:
        raise typer.Exit(run_learner(cfg) if role == "learner" else run_env_actor(name, cfg))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except (EnvUnavailable, KeysError) as exc:
        fail(str(exc), code=1)


def _actor_name(role: str, name: str | None) -> str:
    """`name`, or the role's default (ROLE-HOST-PID for a worker or an env actor, of which a run has
    many; else the role); refused unless it starts with its role."""
    import socket

    from prl_actors.protocol.messages import role_prefix

    name = name or (f"{role}-{socket.gethostname()}-{os.getpid()}" if role in ("worker", "env") else role)
    if role_prefix(name) != role:
        fail(f"actor name {name!r} must start with its role {role!r}")
    return name


def _trainer_rank(cfg: Any) -> None:
    """Under torchrun (RANK set), a rank other than 0 of the trainer group follows rank 0 (which runs
    the trainer actor): docs/DISTRIBUTED.md."""
    from prl_actors.launch.process import exit_now
    from prl_actors.sections import ConfigError
    from prl_actors.trainer.rank_group import RankEnv

    try:
        env = RankEnv.from_environ()
    except ConfigError as exc:
        fail(str(exc))
    if env is None or env.rank == 0 or cfg.trainer.strategy == "single":
        return
    from prl_actors.launch.proctitle import set_title
    from prl_actors.launch.rank import follow_rank

    set_title(f"trainer-rank{env.rank}", cfg.run.name)
    try:
        code = follow_rank(cfg, env)
    except ConfigError as exc:  # WORLD_SIZE / RANK that do not fit the config
        fail(str(exc))
    exit_now(code)


def _claim_run_dir(cfg: Any) -> None:
    """A coordinator started on its own (compose, another host) refuses a finished run's directory
    unless resuming, and leaves the resolved config there for `prl-actors replay` (as `up` does)."""
    rd = Path(cfg.run.run_dir)
    if (rd / "metrics.jsonl").exists() and not cfg.run.resume:
        fail(f"run dir {rd} already holds a run; use another run.run_dir, or run.resume to continue it")
    rd.mkdir(parents=True, exist_ok=True)
    text, path = cfg.dump(), rd / "config.yaml"
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(path)  # atomic: an actor reading the config never sees half of it


def _discover(cfg: Any, coordinator: str, name: str) -> None:
    """Ask a running coordinator where the publisher and buffer are."""
    from prl_actors.launch.client import RequestFailed, request
    from prl_actors.protocol.messages import StatusRequest
    from prl_actors.transport.auth import KeyStore

    keys = KeyStore(cfg.keys_path()) if cfg.authenticated() else None
    try:
        st: Any = request(coordinator, StatusRequest(), cfg.transport.request_timeout_s, keys=keys, as_=name)
    except RequestFailed as exc:
        fail(str(exc))
    cfg.transport.addresses = {**cfg.transport.addresses, "publisher": st.publisher_addr, "buffer": st.buffer_addr}
