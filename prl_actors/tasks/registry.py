"""The task registry: `task.name` -> the task's builder. The only module that imports them all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prl_actors.config import Config, ConfigError
from prl_actors.tasks.arith import add_task
from prl_actors.tasks.base import Task
from prl_actors.tasks.code_task import code_task
from prl_actors.tasks.jsonl import jsonl_task
from prl_actors.tasks.math_task import math_task
from prl_actors.tasks.plugins import load_reward
from prl_actors.tasks.sim import sim_task

TASKS: dict[str, Callable[[Config], Task]] = {
    "add": add_task,
    "jsonl": jsonl_task,
    "math": math_task,
    "code": code_task,
}
TASK_NAMES = tuple(TASKS)
DATASET_TASKS = ("jsonl", "math", "code")


def load_task(cfg: Config) -> Task:
    """The run's task: the sim bandit for the sim engine, else `task.name`, with its reward replaced
    by the `task.reward` plugin or the `task.rewards` list when one is set. On `run.resume`, the data
    must be those of the checkpoint to resume from (data/position.py). See docs/TASKS.md."""
    if cfg.worker.engine == "sim":
        task = sim_task(cfg)
    else:
        _check_options(cfg)
        task = TASKS[cfg.task.name](cfg)
    from prl_actors.rewards.load import configure  # here: rewards.builtins imports tasks.math_answer

    if cfg.task.reward:
        task.reward, task.rewards = load_reward(cfg.task.reward), None
    task.rewards = configure(cfg.task, task.reward_set())
    if cfg.run.resume and cfg.worker.engine != "sim":
        check_resume(cfg, task)
    return task


def _check_options(cfg: Config) -> None:
    t = cfg.task
    if t.name not in TASKS:
        raise ConfigError(f"unknown task {t.name!r}: use one of {', '.join(TASK_NAMES)}")
    if t.name not in DATASET_TASKS:
        for option, value in (("prompts_file", t.prompts_file), ("chat_template", t.chat_template)):
            if value:
                names = f"{', '.join(DATASET_TASKS[:-1])} and {DATASET_TASKS[-1]}"
                raise ConfigError(f"task.{option} applies to the {names} tasks, not {t.name!r}")
    if t.format_reward and t.name != "math":
        raise ConfigError("task.format_reward applies to the math task only")


def check_resume(cfg: Config, task: Task) -> None:
    """Refuse to resume from a checkpoint whose data identity differs (a changed file, seed, B, ...)."""
    from prl_actors.data import position
    from prl_actors.rundir import CheckpointError, RunDir

    try:
        ckpt = RunDir(cfg.run.run_dir).latest_checkpoint()
    except CheckpointError:
        return  # no intact checkpoint: the trainer refuses to start and says why
    if ckpt is not None:
        position.verify(ckpt, task.data_identity(cfg.coordinator.groups_per_epoch))


def data_identity(cfg: Config) -> dict[str, Any]:
    """The identity of the run's prompt stream, as recorded in checkpoints (data/position.py)."""
    return load_task(cfg).data_identity(cfg.coordinator.groups_per_epoch)
