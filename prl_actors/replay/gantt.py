"""The run as a Gantt chart (PNG): one row per actor, its spans as bars, idle as grey, epochs marked.

Rows top to bottom: coordinator, publisher, buffer, trainer, workers. Trainer and worker rows show
their busy spans (colour per span name) over a light grey idle band; the coordinator, publisher and
buffer rows show their key events as ticks (assignments, weights stored / served, groups accepted).
Dashed vertical lines are epoch boundaries (the coordinator's `epoch_open`). Uses matplotlib's Agg
canvas directly (no pyplot, no display): safe in a headless process and in threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prl_actors.replay.axis import TimeAxis, time_axis
from prl_actors.replay.epochs import SETUP, stats, windows
from prl_actors.replay.events import ReplayError, Run
from prl_actors.replay.spans import BUSY_SPANS, Span, lifetime, pair_spans

if TYPE_CHECKING:
    from matplotlib.axes import Axes

COLORS = {
    "generate": "#1f77b4",
    "score": "#17becf",
    "weight_sync": "#9467bd",
    "train": "#ff7f0e",
    "optimizer_step": "#d62728",
    "weight_upload": "#e377c2",
}
TICKS = {
    "coordinator": ("assign", "#7f7f7f"),
    "publisher": ("weights_stored", "#e377c2"),
    "buffer": ("group_accepted", "#2ca02c"),
}
BAR = 0.7


def draw(
    run: Run, path: Path, spans: list[Span] | None = None, epochs: tuple[int | None, int | None] = (None, None)
) -> None:
    """Write the chart to `path` (PNG), cropped to `epochs` (inclusive, None: open); ReplayError
    when matplotlib (the `plots` extra) is missing or no epoch is in the range."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        raise ReplayError(
            "--timeline needs matplotlib: pip install 'prl-actors[plots]' (make install has it)"
        ) from None

    spans = pair_spans(run) if spans is None else spans
    axis = time_axis(run, spans, epochs)
    actors = run.actors
    fig = Figure(figsize=(14, 1.6 + 0.45 * len(actors)), dpi=110)
    ax = fig.add_subplot()
    for row, actor in enumerate(actors):
        y = len(actors) - 1 - row
        _draw_row(ax, run, spans, actor, y, axis)
    _draw_epochs(ax, run, len(actors), axis)
    _draw_gaps(ax, axis, len(actors))
    ax.set_yticks(range(len(actors)), labels=list(reversed(actors)))
    ax.set_ylim(-0.6, len(actors) - 0.1)
    ax.set_xlim(0, max(axis.width, 1e-3))
    folded = f"; {len(axis.gaps)} idle gaps folded" if axis.gaps else ""
    ax.set_xlabel(f"seconds from {axis.lo:.1f}s after the run's first event ({run.clock}){folded}")
    ax.set_title(_title(run, spans), fontsize=10)
    handles = [Patch(color=c, label=n) for n, c in COLORS.items()] + [Patch(color="#dddddd", label="idle")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(handles), fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")


def _bar(axis: TimeAxis, begin: float, end: float) -> tuple[float, float]:
    """(x, width) of the real interval [begin, end] on the axis."""
    x0 = axis.x(begin)
    return x0, axis.x(end) - x0


def _draw_row(ax: Axes, run: Run, spans: list[Span], actor: str, y: int, axis: TimeAxis) -> None:
    role = run.role(actor)
    if role in BUSY_SPANS:
        born, died = lifetime(run, actor)
        if axis.shows(born, died):
            ax.broken_barh([_bar(axis, born, died)], (y - BAR / 4, BAR / 2), color="#dddddd")
        for name, color in COLORS.items():
            mine = [s for s in spans if s.actor == actor and s.name == name and axis.shows(s.begin, s.end)]
            if mine:
                ax.broken_barh([_bar(axis, s.begin, s.end) for s in mine], (y - BAR / 2, BAR), color=color, linewidth=0)
    elif role in TICKS:
        event, color = TICKS[role]
        times = [axis.x(e["t"]) for e in run.of(event, actor=actor) if axis.lo <= e["t"] <= axis.hi]
        ax.vlines(times, y - BAR / 3, y + BAR / 3, color=color, linewidth=1)
        ax.text(0, y + BAR / 2, f" {event}", fontsize=7, va="center", color=color)


def _draw_epochs(ax: Axes, run: Run, rows: int, axis: TimeAxis) -> None:
    shown = [w for w in windows(run) if w.epoch != SETUP and axis.lo <= w.start <= axis.hi]
    every = max(1, len(shown) // 30)  # labels that do not overlap
    for i, w in enumerate(shown):
        ax.axvline(axis.x(w.start), color="black", linestyle="--", linewidth=0.8)
        if i % every == 0:
            ax.text(axis.x(w.start), rows - 0.35, f" e{w.epoch}", fontsize=8, va="bottom")


def _draw_gaps(ax: Axes, axis: TimeAxis, rows: int) -> None:
    """Each folded gap: a hatched band of the axis' fold width, labelled with its real length."""
    for a, b in axis.gaps:
        x0, width = _bar(axis, a, b)
        ax.axvspan(x0, x0 + width, color="#f2f2f2", hatch="//", ec="#999999", linewidth=0)
        ax.text(x0 + width / 2, -0.45, f"gap {b - a:.0f}s", fontsize=7, ha="center", va="bottom", color="#555555")


def _title(run: Run, spans: list[Span]) -> str:
    rows = [r for r in stats(run, spans) if r.window.epoch != SETUP]
    overlap = sum(r.overlap_s for r in rows)
    train = sum(r.train_s for r in rows)
    return (
        f"{run.run_dir.name}  mode {run.mode()}  {len(rows)} epochs  "
        f"train/generate overlap {overlap:.3f}s of {train:.3f}s training"
    )
