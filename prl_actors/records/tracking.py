"""run.report_to: TensorBoard, Weights & Biases, MLflow, written by ONE thread in the `up` process that
follows RUN_DIR/metrics.jsonl (off the hot path: no actor, and never the trainer's step, waits on a
tracker). Training rows are logged at step = epoch; evaluation rows (eval_pass@k, eval_mean@k) at
step = the evaluated epoch, under the same names.

- tensorboard: event files in RUN_DIR/tensorboard (torch.utils.tensorboard's SummaryWriter);
- wandb: offline (WANDB_MODE=offline unless the user set WANDB_MODE), files in RUN_DIR/wandb
  (`wandb sync` uploads them later);
- mlflow: a local file store at RUN_DIR/mlruns (experiment = run.name), unless MLFLOW_TRACKING_URI is set.
The trackers live in the optional extra `track` (make install installs it). A tracker that cannot be
imported or fails is reported in one line and dropped; training goes on.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prl_actors.records.logs import console

NOT_LOGGED = frozenset({"epoch", "version", "eval"})


class Tracker:
    """One library's writer: log(step, scalars) and close()."""

    name = ""

    def log(self, step: int, scalars: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, run_dir: Path, run_name: str, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```", 0)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, run_dir: Path, run_name: str, config: dict[str, Any]) -> None:
        os.environ.setdefault("WANDB_MODE", "offline")  # no network unless the user asks for it
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self.run = wandb.init(
            project="prl-actors", name=run_name, dir=str(run_dir), config=config, settings=wandb.Settings(console="off")
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, run_dir: Path, run_name: str, config: dict[str, Any]) -> None:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3: the file store needs this opt-in
        import mlflow

        self.mlflow = mlflow
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(run_name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(run_name)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        flat = _flatten(config)
        for k, v in list(flat.items())[:500]:
            self.client.log_param(self.run_id, k, str(v)[:500])

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self.client.log_metric(self.run_id, k.replace("@", "_at_"), v, step=step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


TRACKERS: dict[str, Callable[[Path, str, dict[str, Any]], Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
}


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def scalars_of(row: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """(step, scalars) of one metrics.jsonl row."""
    values = {k: float(v) for k, v in row.items() if k not in NOT_LOGGED and isinstance(v, int | float)}
    return int(row.get("epoch", 0)), values


class MetricsFollower:
    """Follows RUN_DIR/metrics.jsonl from `offset` in a thread and feeds every new row to the trackers.
    `stop()` reads what is left, then closes the trackers (the end of `up`)."""

    def __init__(self, run_dir: Path, names: list[str], run_name: str, config: dict[str, Any]) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.trackers: list[Tracker] = []
        for name in names:
            try:
                self.trackers.append(TRACKERS[name](Path(run_dir), run_name, config))
            except Exception as exc:  # a missing extra, a library that fails: one line, training goes on
                console(f"warning: run.report_to {name}: {type(exc).__name__}: {exc} (pip install 'prl-actors[track]')")
        self.offset = self.path.stat().st_size if self.path.exists() else 0  # resume: only what is new
        self.rows = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trackers", daemon=True)

    def start(self) -> MetricsFollower:
        if self.trackers:
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self.poll()

    def poll(self) -> int:
        """Feed the complete lines written since the last poll; returns how many."""
        if not self.path.exists():
            return 0
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
        n = 0
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            try:
                step, values = scalars_of(json.loads(line))
            except ValueError:
                continue
            for t in list(self.trackers):
                try:
                    t.log(step, values)
                except Exception as exc:
                    console(f"warning: run.report_to {t.name} failed ({type(exc).__name__}: {exc}); dropped")
                    self.trackers.remove(t)
            n += 1
        self.offset += end
        self.rows += n
        return n

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.poll()
        for t in self.trackers:
            try:
                t.close()
            except Exception as exc:
                console(f"warning: run.report_to {t.name}: closing failed ({type(exc).__name__}: {exc})")
