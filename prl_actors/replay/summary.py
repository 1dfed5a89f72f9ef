"""The per-epoch summary `prl-actors replay RUN_DIR` prints (plain text, one row per epoch).

Columns: wall, gen (open -> last group accepted), train (trainer busy in train + optimizer step),
overlap (train ∩ generate), trainer idle and mean worker idle (seconds and share of their time in the
epoch), weight sync (trainer upload / mean worker fetch), groups accepted / rejected / requeued and
member joins / leaves. The lines under the table name every join, leave, requeue and rejection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.replay.epochs import SETUP, EpochStats

if TYPE_CHECKING:
    from prl_actors.replay.events import Run

HEADER = (
    f"{'epoch':>5} {'ver':>4} {'wall_s':>7} {'gen_s':>6} {'train_s':>7} {'overlap':>7} "
    f"{'trainer_idle':>12} {'worker_idle':>11} {'up/sync_s':>11} {'acc':>4} {'rej':>4} {'req':>4} {'join/leave':>10}"
)

LEGEND = (
    "gen: open -> last group accepted; train: trainer train + optimizer_step; overlap: train ∩ worker generate;\n"
    "idle: time outside busy spans (worker_idle summed over workers); up/sync: trainer upload / mean worker "
    "fetch;\nacc/rej/req: groups accepted / rejected / requeued; join/leave: members"
)


def _share(idle: float, of: float) -> str:
    return f"{idle:6.3f} {100 * idle / of:3.0f}%" if of > 0 else f"{'-':>11}"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def row_line(r: EpochStats) -> str:
    w = r.window
    gen = f"{r.gen_s:6.3f}" if r.gen_s is not None else f"{'-':>6}"
    worker_idle = _share(sum(r.worker_idle.values()), sum(r.worker_time.values()))
    sync = f"{r.upload_s:5.3f}/{_mean(list(r.sync_s.values())):5.3f}"
    version = f"v{w.version}" if w.epoch != SETUP else "-"
    requeued = sum(len(g) for _, g, _ in r.requeued)
    members = f"+{len(r.joins)}/-{len(r.leaves)}"
    return (
        f"{w.label:>5} {version:>4} {w.wall:7.3f} {gen} {r.train_s:7.3f} {r.overlap_s:7.3f} "
        f"{_share(r.trainer_idle, r.trainer_time):>12} {worker_idle:>11} {sync:>11} "
        f"{r.accepted:4d} {sum(r.rejected.values()):4d} {requeued:4d} {members:>10}"
    )


def detail_lines(r: EpochStats) -> list[str]:
    """Who joined or left, which groups were requeued, why groups were rejected."""
    where = "setup" if r.window.epoch == SETUP else f"epoch {r.window.epoch}"
    out = []
    if r.joins:
        out.append(f"  {where}: joined {', '.join(r.joins)}")
    out += [f"  {where}: {m} left ({why})" for m, why in r.leaves]
    out += [f"  {where}: requeued groups {groups} of {w} ({why})" for w, groups, why in r.requeued]
    if r.rejected:
        reasons = ", ".join(f"{why} x{n}" for why, n in sorted(r.rejected.items()))
        out.append(f"  {where}: rejected {sum(r.rejected.values())} groups: {reasons}")
    return out


def totals_line(rows: list[EpochStats]) -> str:
    epochs = [r for r in rows if r.window.epoch != SETUP]
    wall = sum(r.window.wall for r in epochs)
    train = sum(r.train_s for r in epochs)
    overlap = sum(r.overlap_s for r in epochs)
    t_idle = sum(r.trainer_idle for r in epochs)
    t_time = sum(r.trainer_time for r in epochs)
    w_idle = sum(sum(r.worker_idle.values()) for r in epochs)
    w_time = sum(sum(r.worker_time.values()) for r in epochs)
    return (
        f"{'all':>5} {'':>4} {wall:7.3f} {'':>6} {train:7.3f} {overlap:7.3f} "
        f"{_share(t_idle, t_time):>12} {_share(w_idle, w_time):>11} {'':>11} "
        f"{sum(r.accepted for r in epochs):4d} {sum(sum(r.rejected.values()) for r in epochs):4d} "
        f"{sum(len(g) for r in epochs for _, g, _ in r.requeued):4d}"
    )


def render(run: Run, rows: list[EpochStats]) -> str:
    """The whole summary as text."""
    epochs = [r for r in rows if r.window.epoch != SETUP]
    head = (
        f"run {run.run_dir}  mode {run.mode()}  {len(run.actors)} actors ({', '.join(run.actors)})\n"
        f"{len(run.events)} events over {run.duration:.3f}s (clock {run.clock}), {len(epochs)} epochs"
    )
    shown = [r for r in rows if r.window.epoch != SETUP or r.accepted or r.rejected]
    lines = [head, "", HEADER, *(row_line(r) for r in shown)]
    if epochs:
        lines.append(totals_line(rows))
    lines.append(LEGEND)
    details = [line for r in rows for line in detail_lines(r)]
    if details:
        lines += ["", "membership and groups:", *details]
    lines += [f"note: {n}" for n in run.notes]
    return "\n".join(lines)
