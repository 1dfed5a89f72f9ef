"""The `prl-actors` command line. Thin: parse, validate, then import the heavy parts late."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.bench_cmd import bench  # these two modules import only typer; their heavy imports are lazy
from cli.replay_cmd import replay

app = typer.Typer(
    name="prl-actors",
    help="Periodic-asynchronous GRPO with five ZeroMQ actors. Start with `prl-actors up`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config (see configs/). Default: built-in defaults.")
]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", help="Override a config value: section.key=value (repeatable).")
]
CoordOpt = Annotated[
    str | None,
    typer.Option("--coordinator", envvar="PRL_COORDINATOR", help="Coordinator address, e.g. tcp://host:27500."),
]


def fail(message: str, code: int = 2) -> None:
    """One clear line for a user mistake, never a traceback."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _config(path: Path | None, sets: list[str] | None, extra: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
    from prl_actors.config import ConfigError, load_config, parse_override

    try:
        overrides = dict(parse_override(s) for s in sets or [])
        overrides.update({k: v for k, v in (extra or {}).items() if v is not None})
        return load_config(path, overrides)
    except ConfigError as exc:
        fail(str(exc))


@app.command()
def up(
    config: ConfigOpt = None,
    workers: Annotated[int | None, typer.Option(help="Inference workers to start.", min=0)] = None,
    epochs: Annotated[int | None, typer.Option(help="Iteration-epochs (optimizer steps).", min=1)] = None,
    mode: Annotated[str | None, typer.Option(help="periodic (overlap) or sync (baseline).")] = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Logs, metrics, checkpoints go here.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the last checkpoint in the run dir.")] = False,
    compose: Annotated[bool, typer.Option("--compose", help="Run the services with docker compose instead.")] = False,
    set_: SetOpt = None,
) -> None:
    """Run every actor as a local process until the run completes (Ctrl-C stops all cleanly)."""
    cfg = _config(
        config,
        set_,
        {
            "run.workers": workers,
            "run.epochs": epochs,
            "run.mode": mode,
            "run.run_dir": str(run_dir) if run_dir else None,
            "run.resume": resume or None,
        },
    )
    if compose:
        from prl_actors.compose import compose_up

        raise typer.Exit(compose_up(cfg, config))
    from prl_actors.launcher import Launcher, RunFailed, summary

    rd = Path(cfg.run.run_dir)
    if rd.exists() and (rd / "metrics.jsonl").exists() and not cfg.run.resume:
        fail(f"run dir {rd} already holds a run; use another --run-dir, or --resume to continue it")
    rd.mkdir(parents=True, exist_ok=True)
    cfg_path = rd / "config.yaml"
    cfg_path.write_text(cfg.dump())
    t0 = time.monotonic()
    if cfg.worker.engine != "sim":
        typer.echo(f"preparing model ({cfg.model.path or 'built-in tiny LM'}) ...", err=True)
        from prl_actors.config import ConfigError
        from prl_actors.tasks import load_task
        from prl_actors.topology import model_dir

        try:
            model_dir(cfg)
            load_task(cfg)  # bad rows, templates, a resume on changed data: refused before any actor starts
        except ConfigError as exc:
            fail(str(exc))
    typer.echo(
        f"up: {cfg.run.workers} workers, {cfg.run.epochs} epochs, mode {cfg.run.mode}, "
        f"B={cfg.coordinator.groups_per_epoch} G={cfg.worker.group_size}, engine {cfg.worker.engine}, "
        f"transport {cfg.transport.kind}, run dir {rd}",
        err=True,
    )
    try:
        code = Launcher(cfg, cfg_path, progress=sys.stderr.isatty()).run()
    except RunFailed as exc:
        fail(str(exc), code=1)
    typer.echo(summary(rd, time.monotonic() - t0), err=True)
    raise typer.Exit(code)


@app.command()
def actor(
    role: Annotated[str, typer.Argument(help="coordinator, publisher, buffer, trainer or worker.")],
    config: ConfigOpt = None,
    name: Annotated[
        str | None, typer.Option(help="Unique actor name (default: the role; worker-<host>-<pid>).")
    ] = None,
    coordinator: CoordOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run one actor in this process (what compose services and remote hosts run)."""
    import os

    from prl_actors.topology import PEERS

    if role not in PEERS:
        fail(f"unknown role {role!r}; expected one of {', '.join(PEERS)}")
    extra: dict[str, Any] = {}
    if coordinator:
        extra["transport.addresses.coordinator"] = coordinator
    cfg = _config(config, set_, extra)
    import socket

    name = name or (f"worker-{socket.gethostname()}-{os.getpid()}" if role == "worker" else role)
    if name.split("-", 1)[0] != role:
        fail(f"actor name {name!r} must start with its role {role!r}")
    if coordinator and role in ("worker", "trainer"):
        _discover(cfg, coordinator)
    from prl_actors.config import ConfigError
    from prl_actors.process import ActorFailed, run_actor_process

    try:
        raise typer.Exit(run_actor_process(name, cfg))
    except ActorFailed as exc:
        fail(str(exc), code=1)
    except ConfigError as exc:  # e.g. a bad prompts file, found when the actor loads its task
        fail(str(exc))


def _discover(cfg: Any, coordinator: str) -> None:
    """Ask a running coordinator where the publisher and buffer are."""
    from prl_actors.client import RequestFailed, request
    from prl_actors.protocol.messages import StatusRequest

    try:
        st: Any = request(coordinator, StatusRequest(), timeout_s=cfg.transport.request_timeout_s)
    except RequestFailed as exc:
        fail(str(exc))
    cfg.transport.addresses = {**cfg.transport.addresses, "publisher": st.publisher_addr, "buffer": st.buffer_addr}


def _coordinator_addr(config: Path | None, coordinator: str | None, sets: list[str] | None) -> str:
    if coordinator:
        return coordinator
    if config is None:
        default = Path("runs/latest/config.yaml")
        config = default if default.exists() else None
    return str(_config(config, sets).address("coordinator"))


@app.command()
def status(
    config: ConfigOpt = None,
    coordinator: CoordOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw Status message as JSON.")] = False,
) -> None:
    """Print the live run's epoch, version, members and progress (asks the coordinator)."""
    import msgspec

    from prl_actors.client import RequestFailed, request
    from prl_actors.protocol.messages import StatusRequest

    addr = _coordinator_addr(config, coordinator, None)
    try:
        st: Any = request(addr, StatusRequest())
    except RequestFailed as exc:
        fail(str(exc), code=1)
    if as_json:
        typer.echo(msgspec.json.encode(st).decode())
        return
    typer.echo(
        f"state {st.state}  mode {st.mode}  epoch {st.epoch}/{st.epochs_total}  version {st.version}  "
        f"groups {st.groups_done}/{st.groups_per_epoch} done, {st.groups_outstanding} out"
    )
    if st.waiting_for:
        typer.echo(f"stalled: {st.waiting_for}")
    for m in st.members:
        typer.echo(f"  {m.name:<16} {m.role:<12} v{m.version:<4} holds {m.outstanding}  seen {m.last_seen_s:.1f}s ago")


@app.command()
def scale(
    workers: Annotated[int, typer.Option(help="Wanted number of inference workers.", min=0)],
    config: ConfigOpt = None,
    coordinator: CoordOpt = None,
) -> None:
    """Change the worker count of a running `prl-actors up` (it starts or stops workers to match)."""
    from prl_actors.client import RequestFailed, request
    from prl_actors.protocol.messages import Scale

    addr = _coordinator_addr(config, coordinator, None)
    try:
        request(addr, Scale(workers=workers))
    except RequestFailed as exc:
        fail(str(exc), code=1)
    typer.echo(f"asked for {workers} workers")


@app.command()
def stop(config: ConfigOpt = None, coordinator: CoordOpt = None) -> None:
    """Stop a running run cleanly (every actor gets Shutdown)."""
    from prl_actors.client import RequestFailed, request
    from prl_actors.protocol.messages import RequestStop

    try:
        request(_coordinator_addr(config, coordinator, None), RequestStop(reason="prl-actors stop"))
    except RequestFailed as exc:
        fail(str(exc), code=1)
    typer.echo("stop requested")


app.command()(replay)
app.command()(bench)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
