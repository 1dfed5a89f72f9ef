"""From the run's Config to the parts the libraries build: the one place that unpacks the root config for them.

The libraries (tasks/, model/, envs_llm/) take their own sections and plain values; launch/, cli/,
the benchmarks and the tests hold a whole `Config` and come here. Imports are lazy: `up` reaches the
task and the model directory without importing torch unless a model must be built.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prl_actors.config import Config
    from prl_actors.tasks.base import Task


def task(cfg: Config) -> Task:
    """The run's task (tasks/registry.load_task); on `run.resume` (not the sim engine), refused when
    its data are not those of the checkpoint to resume from (data/position.py)."""
    from prl_actors.tasks.registry import check_resume, load_task

    w = cfg.worker
    loaded = load_task(
        cfg.task,
        cfg.run.seed,
        model_path=cfg.model.path,
        max_new_tokens=w.sampling.max_new_tokens,
        max_model_len=w.max_model_len if w.engine == "vllm" else None,
        sim_arms=cfg.sim.arms if w.engine == "sim" else None,
    )
    if cfg.run.resume and w.engine != "sim":
        check_resume(loaded, cfg.run.run_dir, cfg.coordinator.groups_per_epoch, stride(cfg))
    return loaded


def stride(cfg: Config) -> int:
    """Stream positions per epoch (data/position.py): B, or B x max_sampling_rounds (dynamic sampling)."""
    from prl_actors.training.dynamic_sampling import epoch_stride

    c = cfg.coordinator
    return epoch_stride(c.groups_per_epoch, c.dynamic_sampling, c.max_sampling_rounds)


def data_identity(cfg: Config) -> dict[str, Any]:
    """The identity of the run's prompt stream, as recorded in checkpoints (data/position.py)."""
    return task(cfg).data_identity(cfg.coordinator.groups_per_epoch, stride(cfg))


def model_dir(
    cfg: Config, run_dir: str | Path | None = None, on_step: Callable[[int, int], None] | None = None
) -> Path:
    """model/builtin.prepare_model for the run: `model.path` validated, or the built-in model in
    RUN_DIR/model (`run_dir`, default run.run_dir), built when it must be (torch)."""
    from prl_actors.model.builtin import prepare_model

    return prepare_model(cfg.model, cfg.task, cfg.run.seed, Path(run_dir or cfg.run.run_dir), on_step=on_step)


def ready_model_dir(cfg: Config, run_dir: str | Path | None = None) -> Path | None:
    """model/dirs.ready_model_dir for the run (without torch): None when the built-in model must be built."""
    from prl_actors.model.dirs import ready_model_dir as ready

    return ready(cfg.model, cfg.task, cfg.run.seed, Path(run_dir or cfg.run.run_dir))


def model_key(cfg: Config) -> str:
    """The built-in model's cache key for the run (model/dirs.builtin_key)."""
    from prl_actors.model.dirs import builtin_key

    return builtin_key(cfg.model, cfg.task, cfg.run.seed)
