"""`prl-actors replay RUN_DIR`: debug a run from its logs (summary, checks, replay, trace, timeline).

Exit codes: 0 fine; 1 an invariant was violated, the coordinator replay diverged, or --follow timed
out; 2 bad input (no run dir, no logs, a corrupt log line, a bad --filter), always as one line.
The replay package and matplotlib are imported inside the command, so `prl-actors --help` stays fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def replay(
    run_dir: Annotated[Path, typer.Argument(help="A run directory: logs/<actor>.jsonl (and config.yaml).")],
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Verify on-policy, exactly-once, one step per epoch, replies, and replay the "
            "coordinator; exit 1 naming the offending events on a violation.",
        ),
    ] = False,
    replay_coordinator: Annotated[
        bool,
        typer.Option(
            "--replay-coordinator",
            help="Feed the coordinator's recorded inputs to a fresh coordinator "
            "(built from config.yaml) and report the first decision that differs.",
        ),
    ] = False,
    trace: Annotated[
        Path | None, typer.Option("--trace", help="Write a Chrome/Perfetto trace (open in ui.perfetto.dev).")
    ] = None,
    timeline: Annotated[
        Path | None, typer.Option("--timeline", help="Write a Gantt chart PNG, one row per actor.")
    ] = None,
    filters: Annotated[
        list[str] | None,
        typer.Option(
            "--filter",
            help="Print matching events: actor=NAME (wildcards ok), epoch=N, msg=ID, event=NAME, "
            "type=MSG_TYPE. Repeat a key to OR, combine keys to AND.",
        ),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Print events of a live run as they are logged, until run_done or Ctrl-C.")
    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds --follow waits at most.")] = 600.0,
    completions: Annotated[
        bool, typer.Option("--completions", help="Print the logged completions (run.log_completions), readably.")
    ] = False,
    epoch: Annotated[int | None, typer.Option("--epoch", help="With --completions: only this epoch.")] = None,
    curves: Annotated[
        Path | None,
        typer.Option("--curves", help="Write one PNG of reward, eval, KL, entropy, clip, logprob_diff, epoch time."),
    ] = None,
    epochs: Annotated[
        str | None,
        typer.Option("--epochs", help="Crop --timeline to these epochs: A:B (inclusive), A:, :B or A."),
    ] = None,
) -> None:
    """Debug a run from its logs: per-epoch summary (idle, overlap, groups), invariant checks, replay, trace."""
    from prl_actors.replay.events import ReplayError

    if completions or curves is not None:  # read RUN_DIR's files, not the logs
        raise typer.Exit(_observe(run_dir, completions, epoch, curves))

    try:
        code = _replay(run_dir, check, replay_coordinator, trace, timeline, filters or [], follow, timeout, epochs)
    except ReplayError as exc:
        _fail(str(exc))
    except BrokenPipeError:  # `replay ... | head`: the reader is gone, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        raise typer.Exit(0) from None
    except OSError as exc:
        _fail(f"{exc.filename or run_dir}: {exc.strerror or exc}")
    except (KeyError, TypeError, ValueError) as exc:  # a well-formed line with fields of the wrong shape
        _fail(f"{run_dir}: the logs hold an event replay cannot read ({type(exc).__name__}: {exc})")
    raise typer.Exit(code)


def _decoder(run_dir: Path) -> Callable[[list[int]], str] | None:
    """The run's tokenizer as a decoder of a multi-turn completion's turns (special tokens kept: the
    chat template's role headers), or None (with a note) when its model directory is not here."""
    from prl_actors.config import load_config
    from prl_actors.sections import ConfigError

    try:
        cfg = load_config(run_dir / "config.yaml")
    except (ConfigError, OSError) as exc:
        typer.echo(f"note: turns shown as token counts ({run_dir / 'config.yaml'}: {exc})", err=True)
        return None
    model = Path(cfg.model.path) if cfg.model.path else run_dir / "model"
    try:
        from prl_actors.model.tokenizer import load_tokenizer

        tok = load_tokenizer(model)
    except Exception as exc:  # noqa: BLE001 - any failure only leaves the text out
        typer.echo(f"note: turns shown as token counts (no tokenizer in {model}: {type(exc).__name__})", err=True)
        return None
    return lambda ids: str(tok.decode(ids, skip_special_tokens=False))


def _observe(run_dir: Path, completions: bool, epoch: int | None, curves: Path | None) -> int:
    """--completions / --curves: from completions.jsonl and metrics.jsonl (docs/OBSERVE.md)."""
    from prl_actors.records.rundir import RunDir

    rd = RunDir(run_dir)
    if not run_dir.is_dir():
        _fail(f"{run_dir} is not a directory")
    if completions:
        from prl_actors.trainer import completions as comp

        rows = comp.read(run_dir, epoch)
        if not rows:
            where = f" for epoch {epoch}" if epoch is not None else ""
            _fail(f"no completions{where} in {run_dir / comp.FILE} (set run.log_completions: N)")
        typer.echo(comp.render(rows, _decoder(run_dir) if comp.wants_tokenizer(rows) else None))
    if curves is not None:
        try:
            from prl_actors.records.curves import draw_curves
        except ImportError:
            _fail("--curves needs matplotlib: pip install 'prl-actors[plots]' (make install has it)")
        try:
            rows = rd.all_rows()
        except ValueError as exc:
            _fail(f"{rd.metrics}: not JSON lines ({exc})")
        try:
            drawn = draw_curves(rows, curves, title=str(run_dir))
        except ValueError as exc:
            _fail(f"{rd.metrics}: {exc}")
        typer.echo(f"wrote {curves} ({', '.join(drawn)})", err=True)
    return 0


def _replay(
    run_dir: Path,
    check: bool,
    replay_coordinator: bool,
    trace: Path | None,
    timeline: Path | None,
    filters: list[str],
    follow: bool,
    timeout: float,
    epochs: str | None = None,
) -> int:
    from prl_actors.replay.axis import parse_epochs
    from prl_actors.replay.events import ReplayError, load_run, run_config
    from prl_actors.replay.follow import follow as follow_run
    from prl_actors.replay.follow import parse_filters
    from prl_actors.replay.spans import pair_spans

    flt = parse_filters(filters)
    crop = parse_epochs(epochs) if epochs else (None, None)
    if epochs and timeline is None:
        raise ReplayError("--epochs crops the timeline: use it with --timeline PNG")
    if follow:
        why = follow_run(run_dir, flt, timeout, typer.echo)
        typer.echo(f"follow: stopped ({why})", err=True)
        if why == "timeout":
            return 1
        if not (check or replay_coordinator or trace or timeline):
            return 0
    run = load_run(run_dir)
    if replay_coordinator and not check and run_config(run_dir) is None:  # bad input: before any output
        raise ReplayError(f"no config.yaml in {str(run_dir)!r}: the coordinator replay needs the run's config")
    spans = pair_spans(run)
    if flt and not follow:
        _print_events(run, flt)
    elif not follow:
        _print_summary(run, spans)
    _write_outputs(run, spans, trace, timeline, crop)
    return _run_checks(run, check, replay_coordinator)


def _print_events(run: Any, flt: Any) -> None:
    from prl_actors.replay.follow import format_event

    shown = [e for e in run.events if flt.matches(e)]
    for e in shown:
        typer.echo(format_event(e, e["t"]))
    typer.echo(f"{len(shown)} of {len(run.events)} events match", err=True)


def _print_summary(run: Any, spans: Any) -> None:
    from prl_actors.replay.epochs import stats
    from prl_actors.replay.summary import render

    typer.echo(render(run, stats(run, spans)))


def _write_outputs(
    run: Any, spans: Any, trace: Path | None, timeline: Path | None, crop: tuple[int | None, int | None]
) -> None:
    if trace is not None:
        from prl_actors.replay.trace import write_trace

        n = write_trace(run, trace, spans)
        typer.echo(f"wrote {trace} ({n} trace events; open it in https://ui.perfetto.dev)", err=True)
    if timeline is not None:
        from prl_actors.replay.gantt import draw

        draw(run, timeline, spans, crop)
        typer.echo(f"wrote {timeline}", err=True)


def _run_checks(run: Any, check: bool, replay_coordinator: bool) -> int:
    from prl_actors.replay.checks import coordinator_check, render_checks, run_checks
    from prl_actors.replay.events import ReplayError

    if check:
        results = run_checks(run)
    elif replay_coordinator:
        result = coordinator_check(run)
        if result.skipped:
            raise ReplayError(result.summary.removeprefix("skipped: "))
        results = [result]
    else:
        return 0
    typer.echo("")
    typer.echo(render_checks(results))
    return 0 if all(r.ok for r in results) else 1
