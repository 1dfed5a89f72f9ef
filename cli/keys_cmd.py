"""`prl-actors keys`: the CurveZMQ keys of a run (create, export for another host, list, revoke).

Imports only typer at module level (the heavy parts load when a command runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prl_actors.cli.common import fail as _fail

keys_app = typer.Typer(
    name="keys",
    help="The run's CurveZMQ keys (docs/SECURITY.md): `up` creates them in RUN_DIR/keys; a joiner on "
    "another host needs an exported copy.",
    no_args_is_help=True,
)

DirOpt = Annotated[
    Path | None,
    typer.Option("--dir", "-d", envvar="PRL_KEYS", help="Key directory. Default: RUN_DIR/keys of --run-dir."),
]
RunDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--run-dir",
        help="The run whose keys (RUN_DIR/keys) to use. Default: the newest live run started on this "
        "machine, else runs/latest.",
    ),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Use this config's key directory (transport.keys_dir, else its RUN_DIR/keys)."),
]


def _dir(directory: Path | None, run_dir: Path | None, config: Path | None = None) -> Path:
    if directory is not None:
        return directory
    if config is not None:
        from prl_actors.config import load_config
        from prl_actors.sections import ConfigError

        try:
            return load_config(config).keys_path()
        except ConfigError as exc:
            _fail(str(exc))
    if run_dir is None:
        from prl_actors.records.rundir import live_run

        run_dir = live_run() or Path("runs/latest")
    return run_dir / "keys"


@keys_app.command("create")
def create(
    names: Annotated[
        list[str] | None,
        typer.Argument(help="Key names (each starts with a role, e.g. worker-gpu1). Default: one per role."),
    ] = None,
    directory: DirOpt = None,
    run_dir: RunDirOpt = None,
    config: ConfigOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Replace existing keys (their holders lose access).")] = False,
) -> None:
    """Create keys (0600 files in a 0700 directory); existing ones are kept unless --force."""
    from prl_actors.transport.auth import KeysError, create_keys, run_key_names

    path = _dir(directory, run_dir, config)
    try:
        made = create_keys(path, names or run_key_names(), overwrite=force)
    except KeysError as exc:
        _fail(str(exc))
    typer.echo(f"created {', '.join(made) or 'nothing (all exist)'} in {path}")


@keys_app.command("export")
def export(
    name: Annotated[str, typer.Argument(help="Whose secret key to export, e.g. worker, worker-gpu1, operator.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write (copy it to the other host).")],
    directory: DirOpt = None,
    run_dir: RunDirOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Write NAME's secret key and every public key to --out: all a peer on another host needs."""
    from prl_actors.transport.auth import KeysError, export_keys

    try:
        files = export_keys(_dir(directory, run_dir, config), name, out)
    except KeysError as exc:
        _fail(str(exc))
    typer.echo(f"wrote {len(files)} files to {out}: {', '.join(files)}")
    typer.echo(f"on the other host: prl-actors actor <role> --keys {out} --coordinator tcp://<host>:<port> ...")


@keys_app.command("list")
def list_keys(directory: DirOpt = None, run_dir: RunDirOpt = None) -> None:
    """Every admitted key (a public key in the directory): name, role, whether its secret is here."""
    from prl_actors.transport.auth import PUBLIC, SECRET, role_of_name

    path = _dir(directory, run_dir)
    for pub in sorted(path.glob(f"*{PUBLIC}")):
        name = pub.name[: -len(PUBLIC)]
        secret = "secret here" if (path / f"{name}{SECRET}").exists() else "public only"
        typer.echo(f"{name:<20} {role_of_name(name) or '(not a role: ignored)':<12} {secret}")


@keys_app.command("revoke")
def revoke(
    name: Annotated[str, typer.Argument(help="The key to remove, e.g. worker-gpu1.")],
    directory: DirOpt = None,
    run_dir: RunDirOpt = None,
) -> None:
    """Remove NAME's keys: its next handshake is refused (an open connection stays until it drops)."""
    from prl_actors.transport.auth import PUBLIC, SECRET

    path = _dir(directory, run_dir)
    gone = [f for f in (f"{name}{PUBLIC}", f"{name}{SECRET}") if (path / f).exists()]
    if not gone:
        _fail(f"no key {name!r} in {path}")
    for f in gone:
        (path / f).unlink()
    typer.echo(f"removed {', '.join(gone)} from {path}; copies elsewhere (other hosts) must go too")
