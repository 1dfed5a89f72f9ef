"""The `prl-actors` command line. Thin: parse, validate, then import the heavy parts late."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.bench_cmd import bench  # these modules import only typer; their heavy imports are lazy
from cli.keys_cmd import keys_app
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
KeysOpt = Annotated[
    Path | None,
    typer.Option(
        "--keys",
        envvar="PRL_KEYS",
        help="CurveZMQ key directory (default: the run's RUN_DIR/keys; on another host an exported copy, "
        "see `prl-actors keys export`).",
    ),
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
    from prl_actors.rundir import RunDir
    from prl_actors.transport.auth import create_keys, run_key_names

    rd = Path(cfg.run.run_dir)
    if RunDir(rd).has_run() and not cfg.run.resume:
        fail(f"run dir {rd} already holds a run; use another --run-dir, or --resume to continue it")
    rd.mkdir(parents=True, exist_ok=True)
    cfg_path = RunDir(rd).config
    cfg_path.write_text(cfg.dump())
    if cfg.authenticated():  # the run's keys: every actor started here reads its own from RUN_DIR/keys
        create_keys(cfg.keys_path(), run_key_names())
    elif cfg.transport.kind != "inproc":
        typer.secho(
            "warning: transport.auth is none: any process on this host can act as any actor (docs/SECURITY.md)",
            fg=typer.colors.YELLOW,
            err=True,
        )
    t0 = time.monotonic()
    if cfg.worker.engine != "sim":
        typer.echo(f"preparing model ({cfg.model.path or 'built-in tiny LM'}) ...", err=True)
        from prl_actors.config import ConfigError
        from prl_actors.topology import model_dir

        try:
            model_dir(cfg)
        except ConfigError as exc:
            fail(str(exc))
    typer.echo(
        f"up: {cfg.run.workers} workers, {cfg.run.epochs} epochs, mode {cfg.run.mode}, "
        f"B={cfg.coordinator.groups_per_epoch} G={cfg.worker.group_size}, engine {cfg.worker.engine}, "
        f"transport {cfg.transport.kind} (auth {cfg.transport.auth if cfg.transport.kind != 'inproc' else 'none'}), "
        f"run dir {rd}",
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
    keys: KeysOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run one actor in this process (what compose services and remote hosts run).

    It authenticates with its own key (or its role's) from --keys (default RUN_DIR/keys).
    """
    import os

    from prl_actors.topology import PEERS

    if role not in PEERS:
        fail(f"unknown role {role!r}; expected one of {', '.join(PEERS)}")
    extra: dict[str, Any] = {}
    if coordinator:
        extra["transport.addresses.coordinator"] = coordinator
    if keys:
        extra["transport.keys_dir"] = str(keys)
    cfg = _config(config, set_, extra)
    import socket

    name = name or (f"worker-{socket.gethostname()}-{os.getpid()}" if role == "worker" else role)
    if name.split("-", 1)[0] != role:
        fail(f"actor name {name!r} must start with its role {role!r}")
    if coordinator and role in ("worker", "trainer"):
        _discover(cfg, coordinator, name)
    from prl_actors.process import ActorFailed, run_actor_process
    from prl_actors.transport.auth import KeysError

    try:
        raise typer.Exit(run_actor_process(name, cfg))
    except (ActorFailed, KeysError) as exc:
        fail(str(exc), code=1)


def _discover(cfg: Any, coordinator: str, name: str) -> None:
    """Ask a running coordinator where the publisher and buffer are."""
    from prl_actors.client import RequestFailed, request
    from prl_actors.protocol.messages import StatusRequest
    from prl_actors.transport.auth import KeyStore

    keys = KeyStore(cfg.keys_path()) if cfg.authenticated() else None
    try:
        st: Any = request(coordinator, StatusRequest(), cfg.transport.request_timeout_s, keys=keys, as_=name)
    except RequestFailed as exc:
        fail(str(exc))
    cfg.transport.addresses = {**cfg.transport.addresses, "publisher": st.publisher_addr, "buffer": st.buffer_addr}


def _target(config: Path | None, coordinator: str | None, keys: Path | None) -> tuple[str, Any]:
    """(coordinator address, KeyStore or None) from the options, else the config (default
    runs/latest/config.yaml): its coordinator address and its keys (RUN_DIR/keys)."""
    from prl_actors.transport.auth import KeyStore

    if config is None:
        default = Path("runs/latest/config.yaml")
        config = default if default.exists() else None
    cfg = _config(config, None)
    if keys is None and cfg.authenticated() and cfg.keys_path().is_dir():
        keys = cfg.keys_path()
    return coordinator or str(cfg.address("coordinator")), KeyStore(keys) if keys is not None else None


@app.command()
def status(
    config: ConfigOpt = None,
    coordinator: CoordOpt = None,
    keys: KeysOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw Status message as JSON.")] = False,
) -> None:
    """Print the live run's epoch, version, members, progress and refusals (asks the coordinator)."""
    import msgspec

    from prl_actors.client import RequestFailed, request
    from prl_actors.protocol.messages import StatusRequest

    addr, store = _target(config, coordinator, keys)
    try:
        st: Any = request(addr, StatusRequest(), keys=store)
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
        refused = f"  refused {m.refused}" if m.refused else ""
        typer.echo(
            f"  {m.name:<16} {m.role:<12} v{m.version:<4} holds {m.outstanding}  seen {m.last_seen_s:.1f}s ago{refused}"
        )
    if st.refused:
        typer.echo("coordinator refused: " + ", ".join(f"{k} {v}" for k, v in st.refused.items()))


@app.command()
def scale(
    workers: Annotated[int, typer.Option(help="Wanted number of inference workers.", min=0)],
    config: ConfigOpt = None,
    coordinator: CoordOpt = None,
    keys: KeysOpt = None,
) -> None:
    """Change the worker count of a running `prl-actors up` (it starts or stops workers to match).

    Needs the operator key; at most run.max_workers.
    """
    from prl_actors.client import RequestFailed, request
    from prl_actors.protocol.messages import Scale

    addr, store = _target(config, coordinator, keys)
    try:
        request(addr, Scale(workers=workers), keys=store)
    except RequestFailed as exc:
        fail(str(exc), code=1)
    typer.echo(f"asked for {workers} workers")


@app.command()
def stop(config: ConfigOpt = None, coordinator: CoordOpt = None, keys: KeysOpt = None) -> None:
    """Stop a running run cleanly (every actor gets Shutdown).

    Needs the operator key.
    """
    from prl_actors.client import RequestFailed, request
    from prl_actors.protocol.messages import RequestStop

    addr, store = _target(config, coordinator, keys)
    try:
        request(addr, RequestStop(reason="prl-actors stop"), keys=store)
    except RequestFailed as exc:
        fail(str(exc), code=1)
    typer.echo("stop requested")


app.command()(replay)
app.command()(bench)
app.add_typer(keys_app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
