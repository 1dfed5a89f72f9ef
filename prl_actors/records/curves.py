"""`prl-actors replay RUN --curves curves.png`: one figure of a run's learning curves from metrics.jsonl.

Panels (each drawn only when the run has the metric): reward (mean and accuracy) with eval pass@k and
mean@k at the evaluated versions, loss, grad norm, response length, KL to the reference, entropy, clip
fraction (low/high where reported), logprob_diff (max and mean: engine vs trainer log-probs), and
seconds per epoch. x is the epoch; an evaluation of weights v_e
is drawn at x = e (the weights epoch e starts from; the final one at x = E).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward_mean", "accuracy")),
    ("loss", ("loss",)),
    ("grad norm", ("grad_norm",)),
    ("response length (tokens)", ("response_len",)),
    ("KL (policy || reference)", ("kl",)),
    ("entropy", ("entropy",)),
    ("clip fraction", ("clip_frac", "clip_frac_low", "clip_frac_high")),
    ("logprob_diff (engine vs trainer)", ("logprob_diff_max", "logprob_diff_mean")),
    ("seconds per epoch", ("wall_s", "gen_s", "train_s")),
)


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    pts = [(float(r["epoch"]), float(r[key])) for r in rows if isinstance(r.get(key), int | float)]
    return [x for x, _ in pts], [y for _, y in pts]


def draw_curves(rows: list[dict[str, Any]], path: Path, title: str = "") -> list[str]:
    """Write the figure to `path` (PNG); returns the panels drawn. ValueError when there is no epoch."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    train = [r for r in rows if not r.get("eval")]
    evals = [r for r in rows if r.get("eval")]
    if not train and not evals:
        raise ValueError("metrics.jsonl holds no epoch")
    panels = [(name, keys) for name, keys in PANELS if any(_series(train, k)[0] for k in keys)]
    if not panels:
        panels = [PANELS[0]]
    cols = 2 if len(panels) > 1 else 1
    nrows = -(-len(panels) // cols)
    fig = Figure(figsize=(6.0 * cols, 2.8 * nrows + 0.6), dpi=100)
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    for ax, (name, keys) in zip(axes, panels, strict=False):
        for key in keys:
            xs, ys = _series(train, key)
            if xs:
                ax.plot(xs, ys, marker="." if len(xs) < 60 else None, label=key)
        if name == "reward":
            for key in sorted({k for r in evals for k in r if k.startswith("eval_")} - {"eval_s"}):
                xs, ys = _series(evals, key)
                ax.plot(xs, ys, marker="o", linestyle="--", label=key)
            if all(0 <= y <= 1 for r in rows for y in _rewards(r)):
                ax.set_ylim(-0.02, 1.02)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("epoch", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return [name for name, _ in panels]


def _rewards(r: dict[str, Any]) -> list[float]:
    keys = ("reward_mean", "accuracy")
    return [float(v) for k, v in r.items() if (k in keys or k.startswith("eval_pass") or k.startswith("eval_mean"))]
