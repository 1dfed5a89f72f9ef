"""`prl-actors bench`: the benchmark suite (speed-ups against their physical limits).

The suite is the `prl_bench` package (bench/prl_bench in the repository), imported inside the command
so `prl-actors --help` stays fast and an install without it still runs everything else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prl_actors.cli.common import fail as _fail

NOT_INSTALLED = (
    "the benchmark suite (package prl_bench, from the repository's bench/ folder) is not installed here: "
    "install prl-actors from a source checkout (make install, or pip install '.[plots]')"
)


def bench(
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Directory for results.json, results.md and the PNG plots (plots need the `plots` extra)."
        ),
    ] = Path("bench_out"),
    quick: Annotated[bool, typer.Option("--quick", help="Smaller sizes: the whole suite in a few minutes.")] = False,
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            help="Run only these: pipeline, shared_prompt, weight_sync, lora_sync, control_plane, e2e, envs, "
            "dist_step, multiturn, rewards, startup, minibatch, eval_cost, group_checks, bounded, burst_batching, "
            "heal, gpu (the trainer and engine on CUDA at issue 37's shape; one skip line without CUDA) "
            "(repeatable or a,b).",
        ),
    ] = None,
    machine: Annotated[
        str,
        typer.Option("--machine", envvar="PRL_BENCH_MACHINE", help="A label for this machine in the results."),
    ] = "",
    auth: Annotated[
        str,
        typer.Option(
            "--auth",
            help="transport.auth of the benchmarks' runs over tcp (control plane, tiny-LM pipeline, envs): "
            "curve (as a run, the default) or none.",
        ),
    ] = "curve",
    keep_work: Annotated[
        bool, typer.Option("--keep-work", help="Keep the benchmark runs' logs under OUT/work (default: deleted).")
    ] = False,
) -> None:
    """Run the benchmarks; every ratio is measured side by side in one run on this machine."""
    try:
        from prl_bench.suite import UnknownBenchmark, resolve, run_suite
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "prl_bench":
            raise
        _fail(NOT_INSTALLED)

    try:
        resolve(only)
    except UnknownBenchmark as exc:
        _fail(str(exc))

    def say(line: str) -> None:
        typer.echo(line, err=True)

    if auth not in ("curve", "none"):
        _fail(f"--auth {auth!r}: expected curve or none")
    results = run_suite(out, quick=quick, only=only, label=machine, keep_work=keep_work, say=say, auth=auth)
    missed = [e["name"] for e in results["entries"] if e["passed"] is False]
    failed = [b["name"] for b in results["benchmarks"] if b.get("error")]
    typer.echo(
        f"{len(results['entries'])} results, {len(missed)} goals missed, {len(failed)} benchmarks failed; "
        f"see {out / 'results.md'}",
        err=True,
    )
    raise typer.Exit(1 if failed else 0)
