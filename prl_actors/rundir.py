"""The run directory: its layout, and the one object that writes a run's files besides the logs.

    RUN_DIR/config.yaml          the resolved config
    RUN_DIR/logs/<actor>.jsonl   one structlog JSON-lines file per actor (docs/LOGS.md)
    RUN_DIR/metrics.jsonl        one JSON object per epoch
    RUN_DIR/checkpoints/v<N>/    learner state after the step that made version N (DONE marks complete)
    RUN_DIR/model/               the built-in tiny model (an ordinary Hugging Face directory)

Actor cores never touch the disk or the console themselves: the trainer is handed a `TrainerSink`
(a `RunDir` in a run, a `MemorySink` in tests) and calls it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from prl_actors.logs import console

CONFIG = "config.yaml"
LOGS = "logs"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
MODEL = "model"
DONE = "DONE"
EPOCH_LINE_KEYS = ("reward_mean", "accuracy", "samples_per_s", "gen_s", "train_s", "wall_s")


class TrainerSink(Protocol):
    """Where the trainer's durable outputs go."""

    def epoch_metrics(self, row: Mapping[str, Any]) -> None:
        """One finished epoch's metrics (has `epoch` and `version`)."""
        ...

    def save_checkpoint(self, version: int, write: Callable[[Path], None]) -> Path | None:
        """Let `write(dir)` fill the checkpoint of `version`, then mark it complete (None: not kept)."""
        ...

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint, if any."""
        ...


def epoch_line(row: Mapping[str, Any]) -> str:
    """The one console line per finished epoch."""
    shown = "  ".join(f"{k}={row[k]:.3f}" for k in EPOCH_LINE_KEYS if k in row)
    return f"epoch {row['epoch']:>3}  v{row['version']:<3} {shown}"


class RunDir:
    """A run directory on disk. As a `TrainerSink` it appends metrics.jsonl, writes checkpoints and,
    with `echo`, prints one line per epoch."""

    def __init__(self, root: Path | str, echo: bool = False) -> None:
        self.root, self.echo = Path(root), echo

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def logs(self) -> Path:
        return self.root / LOGS

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def model(self) -> Path:
        return self.root / MODEL

    def log_path(self, actor: str) -> Path:
        return self.logs / f"{actor}.jsonl"

    def has_run(self) -> bool:
        return self.metrics.exists()

    def metrics_rows(self) -> list[dict[str, Any]]:
        if not self.metrics.exists():
            return []
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]

    # --- TrainerSink --------------------------------------------------------------------------

    def epoch_metrics(self, row: Mapping[str, Any]) -> None:
        if self.echo:
            console(epoch_line(row))
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.metrics, "a") as f:
            f.write(json.dumps(dict(row)) + "\n")

    def save_checkpoint(self, version: int, write: Callable[[Path], None]) -> Path:
        path = self.checkpoints / f"v{version}"
        path.mkdir(parents=True, exist_ok=True)
        (path / DONE).unlink(missing_ok=True)
        write(path)
        (path / DONE).write_text(str(version))
        return path

    def latest_checkpoint(self) -> Path | None:
        """The newest `checkpoints/v<version>` directory that is complete (has its DONE marker)."""
        root = self.checkpoints
        done = [p for p in root.glob("v*") if (p / DONE).exists()] if root.exists() else []
        return max(done, key=lambda p: int(p.name[1:]), default=None)


class MemorySink:
    """A `TrainerSink` that keeps metrics in memory and no checkpoints (unit tests, benchmarks)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def epoch_metrics(self, row: Mapping[str, Any]) -> None:
        self.rows.append(dict(row))

    def save_checkpoint(self, version: int, write: Callable[[Path], None]) -> Path | None:
        return None

    def latest_checkpoint(self) -> Path | None:
        return None
