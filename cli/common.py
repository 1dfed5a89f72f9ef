"""What the commands share: the config options and the one-line failure. Imports only typer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config (see configs/). Default: built-in defaults.")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", metavar="KEY=VALUE", help="Override a config value: section.key=value, a list as a,b (repeatable)."
    ),
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


def fail(message: str, code: int = 2) -> NoReturn:
    """One clear line for a user mistake, never a traceback."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _overrides(sets: list[str] | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The dotted overrides: each --set, then the flags given (None: not given), which win."""
    from prl_actors.config import parse_override

    overrides = dict(parse_override(s) for s in sets or [])
    overrides.update({k: v for k, v in (extra or {}).items() if v is not None})
    return overrides


def _config(path: Path | None, sets: list[str] | None, extra: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
    from prl_actors.config import load_config
    from prl_actors.sections import ConfigError

    try:
        return load_config(path, _overrides(sets, extra))
    except ConfigError as exc:
        fail(str(exc))
