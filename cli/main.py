"""The `prl-actors` command line. Thin: parse, validate, then import the heavy parts late."""

from __future__ import annotations

from typing import Annotated

import typer

from prl_actors.cli.actor_cmd import actor
from prl_actors.cli.bench_cmd import bench  # these modules import only typer; their heavy imports are lazy
from prl_actors.cli.config_cmd import config_app
from prl_actors.cli.export_cmd import export
from prl_actors.cli.keys_cmd import keys_app
from prl_actors.cli.labels import label
from prl_actors.cli.replay_cmd import replay
from prl_actors.cli.target import health, scale, status, stop
from prl_actors.cli.up_cmd import up

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


# `prl-actors -h` lists each command with its short help (a docstring's first sentence would be cut).
app.command(short_help="Train: every actor as a local process (or --compose services).")(up)
app.command(short_help="Run one actor here (compose services, remote hosts).")(actor)
app.command(short_help="A live run's epoch, members, progress and refusals.")(status)
app.command(short_help="Exit 0 when the run (and a member) answers: a healthcheck.")(health)
app.command(short_help="Change a live run's number of workers.")(scale)
app.command(short_help="Stop a live run cleanly (resumable).")(stop)
app.command(short_help="Debug a run from its logs: summary, --check, trace, curves.")(replay)
app.command(short_help="Run the benchmarks.")(bench)
app.command("export", short_help="Export a checkpoint as a Hugging Face model directory.")(export)
app.command("export-merged", hidden=True)(export)  # the older name of a LoRA run's export
app.add_typer(keys_app, short_help="Create and export the run's CurveZMQ keys.")
app.add_typer(config_app, short_help="The resolved config and the reference of every option.")
label(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
