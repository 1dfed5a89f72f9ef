"""`status`, `scale`, `stop`, `health`: the operator's commands on a running run.

Each takes the run the same way `replay` and `export` do, a positional RUN_DIR (its config.yaml
names the coordinator and its keys), or `--config RUN_DIR/config.yaml`, or `--coordinator ADDR`;
with none of them, the newest live run `up` started on this machine. Each says first which run it
acts on and how it was found (`run: runs/a (newest live run)`), so a wrong guess is seen at once.
Imports only typer at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from prl_actors.cli.common import CoordOpt, KeysOpt
from prl_actors.cli.common import fail as _fail

RunDirArg = Annotated[
    Path | None,
    typer.Argument(
        help="The run directory (as `up --run-dir` made it); default: the newest live run on this machine.",
        show_default=False,
    ),
]
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="The run's RUN_DIR/config.yaml.")]


@dataclass
class Target:
    """The run a command acts on: the coordinator's address, the keys, and a label for the user."""

    address: str
    keys: Any  # KeyStore | None
    label: str  # 'runs/a (newest live run)'
    config_path: Path | None
    cfg: Any  # the run's Config (defaults when only --coordinator was given)
    guessed: bool  # found without RUN_DIR/--config/--coordinator


def find_target(run_dir: Path | None, config: Path | None, coordinator: str | None, keys: Path | None) -> Target:
    """RUN_DIR, else --config, else --coordinator, else the newest live run `up` started here
    (the run registry), else runs/latest/config.yaml."""
    from prl_actors.config import load_config
    from prl_actors.records.rundir import live_run
    from prl_actors.sections import ConfigError
    from prl_actors.transport.auth import KeyStore

    how, guessed = "", False
    if run_dir is not None and config is not None:
        _fail("give the run directory or --config, not both")
    if run_dir is not None:
        config = run_dir / "config.yaml"
        if not config.is_file():
            _fail(
                f"{run_dir} holds no config.yaml: not a run directory (`prl-actors up --run-dir {run_dir}` makes one)"
            )
        how = "given"
    elif config is not None:
        how = "given"
    elif coordinator is None:
        guessed = True
        live = live_run()
        if live is not None:
            config, how = live / "config.yaml", "newest live run on this machine"
        elif Path("runs/latest/config.yaml").is_file():
            config, how = Path("runs/latest/config.yaml"), "runs/latest: no live run registered on this machine"
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        _fail(str(exc))
    if keys is None and cfg.authenticated() and cfg.keys_path().is_dir():
        keys = cfg.keys_path()
    address = coordinator or str(cfg.address("coordinator"))
    where = str(config.parent) if config is not None else address
    label = f"{where} ({how})" if how else where
    store = KeyStore(keys) if keys is not None else None
    return Target(address, store, label, config, cfg, guessed)


def unreachable(exc: Exception, target: Target) -> NoReturn:
    """The request failed: say so, and how to name a run that is up."""
    from prl_actors.records.rundir import is_live, registered_runs

    hint, where = "", target.config_path.parent if target.config_path is not None else None
    if where is None:
        recent = registered_runs()[:3] if target.guessed else []
        listed = ", ".join(f"{p} ({'live' if is_live(p) else 'not running'})" for p in recent)
        if target.guessed:
            hint = "; no live run found on this machine: pass the run's directory, e.g. `prl-actors status RUN_DIR`"
            hint += f" or --config {recent[0] / 'config.yaml'} (recent runs: {listed})" if recent else ""
    elif not is_live(where) and (where / "metrics.jsonl").is_file():  # its `up` has ended (or runs elsewhere)
        epochs = sum(1 for line in (where / "metrics.jsonl").read_text().splitlines() if '"eval": true' not in line)
        hint = (
            f"; no `prl-actors up` on this machine runs {where}: it has ended ({epochs} epochs in metrics.jsonl; "
            f"`prl-actors replay {where}` reads it, `prl-actors up --resume --run-dir {where} --epochs N` trains on)"
        )
    elif target.guessed:
        hint = f"; the run in {where} does not answer: see {where / 'logs'}"
    else:
        hint = f"; is the run in {where} still up? (its `prl-actors up` must be running)"
    _fail(f"{exc}{hint}", code=1)


def status(
    run_dir: RunDirArg = None,
    config: ConfigOpt = None,
    coordinator: CoordOpt = None,
    keys: KeysOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw Status message as JSON.")] = False,
) -> None:
    """Print a live run's epoch, version, members, progress and refusals (asks its coordinator)."""
    import msgspec

    from prl_actors.launch.client import RequestFailed, request
    from prl_actors.protocol.messages import StatusRequest

    target = find_target(run_dir, config, coordinator, keys)
    try:
        st: Any = request(target.address, StatusRequest(), keys=target.keys)
    except RequestFailed as exc:
        unreachable(exc, target)
    if as_json:
        typer.echo(msgspec.json.encode(st).decode())
        return
    typer.echo(f"run: {target.label}")
    typer.echo(
        f"state {st.state}  mode {st.mode}  epoch {st.epoch}/{st.epochs_total}  version {st.version}  "
        f"groups {st.groups_done}/{st.groups_per_epoch} done, {st.groups_outstanding} out"
    )
    if st.waiting_for:
        typer.echo(f"stalled: {st.waiting_for}")
    if st.eval:  # the latest finished evaluation (docs/OBSERVE.md)
        ev = st.eval
        scores = "  ".join(f"{k} {v:.3f}" for k, v in ev.items() if k.startswith("eval_") and k != "eval_s")
        typer.echo(f"eval   v{int(ev.get('version', -1))} (epoch {int(ev.get('epoch', -1))}): {scores}")
    for m in st.members:
        refused = f"  refused {m.refused}" if m.refused else ""
        typer.echo(
            f"  {m.name:<16} {m.role:<12} v{m.version:<4} holds {m.outstanding}  seen {m.last_seen_s:.1f}s ago{refused}"
        )
    if st.refused:
        typer.echo("coordinator refused: " + ", ".join(f"{k} {v}" for k, v in st.refused.items()))


def health(
    run_dir: RunDirArg = None,
    config: ConfigOpt = None,
    coordinator: CoordOpt = None,
    keys: KeysOpt = None,
    member: Annotated[
        str | None, typer.Option(help="Also require this member (or name prefix, e.g. worker-HOST) to be registered.")
    ] = None,
    max_age: Annotated[
        float | None, typer.Option(help="Seconds since last seen (default: coordinator.heartbeat_timeout_s).")
    ] = None,
) -> None:
    """Exit 0 when the coordinator answers (and MEMBER is registered and recently seen): a healthcheck.

    It asks with MEMBER's key (or its role's), else the operator key, from --keys (default RUN_DIR/keys).
    """
    from prl_actors.launch.client import RequestFailed, request
    from prl_actors.launch.compose import health_problem
    from prl_actors.protocol.messages import StatusRequest

    target = find_target(run_dir, config, coordinator, keys)
    try:
        st: Any = request(target.address, StatusRequest(), timeout_s=5.0, keys=target.keys, as_=member or "operator")
    except RequestFailed as exc:
        unreachable(exc, target)
    problem = health_problem(st, member, max_age or target.cfg.coordinator.heartbeat_timeout_s)
    if problem:
        _fail(problem, code=1)
    typer.echo(f"healthy: {member or 'coordinator'} (state {st.state}, epoch {st.epoch}) of run {target.label}")


def scale(
    workers: Annotated[int, typer.Option(help="Wanted number of inference workers.", min=0)],
    run_dir: RunDirArg = None,
    config: ConfigOpt = None,
    coordinator: CoordOpt = None,
    keys: KeysOpt = None,
) -> None:
    """Change the worker count of a running `prl-actors up` (it starts or stops workers to match;
    under `up --compose` it scales the inference service).

    Needs the operator key; at most run.max_workers.
    """
    from prl_actors.launch.client import RequestFailed, request
    from prl_actors.protocol.messages import Scale

    target = find_target(run_dir, config, coordinator, keys)
    try:
        request(target.address, Scale(workers=workers), keys=target.keys)
    except RequestFailed as exc:
        unreachable(exc, target)
    typer.echo(f"asked run {target.label} for {workers} workers")


def stop(
    run_dir: RunDirArg = None, config: ConfigOpt = None, coordinator: CoordOpt = None, keys: KeysOpt = None
) -> None:
    """Stop a running run cleanly (every actor gets Shutdown; `up --resume` continues it).

    Needs the operator key.
    """
    from prl_actors.launch.client import RequestFailed, request
    from prl_actors.protocol.messages import RequestStop

    target = find_target(run_dir, config, coordinator, keys)
    try:
        request(target.address, RequestStop(reason="prl-actors stop"), keys=target.keys)
    except RequestFailed as exc:
        unreachable(exc, target)
    typer.echo(f"stop requested of run {target.label}")
