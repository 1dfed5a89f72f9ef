"""The `prl-actors` command line. Thin: parse, validate, then import the heavy parts late."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.actor_cmd import actor
from cli.bench_cmd import bench  # these modules import only typer; their heavy imports are lazy
from cli.config_cmd import config_app
from cli.export_cmd import export
from cli.keys_cmd import keys_app
from cli.labels import label
from cli.replay_cmd import replay
from cli.target import health, scale, status, stop
from cli.up_cmd import up

app = typer.Typer(
    name="prl-actors",
    help="Periodic-asynchronous GRPO with five ZeroMQ actors. Start with `prl-actors up`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,  # plain click help: no `<bool>` type column (readable labels: cli/labels.py)
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"prl-actors {version('prl-actors')}")
        except PackageNotFoundError:
            typer.echo("prl-actors (not installed: run from a source tree)")
        raise typer.Exit(0)


@app.callback()
def _main(
    show_version: Annotated[
        bool, typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Periodic-asynchronous GRPO with five ZeroMQ actors. Start with `prl-actors up`."""


app.command()(up)
app.command()(actor)
app.command()(status)
app.command()(health)
app.command()(scale)
app.command()(stop)
app.command()(replay)
app.command()(bench)
app.add_typer(keys_app)
app.add_typer(config_app)
app.command("export")(export)
app.command("export-merged", hidden=True)(export)  # the older name of a LoRA run's export
label(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
