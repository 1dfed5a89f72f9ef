"""The task registry: `task.name` -> the task's builder. The only module that imports them all."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from prl_actors.rewards.load import PLUGIN_TIMEOUT_S, configure
from prl_actors.sections import ConfigError
from prl_actors.tasks.arith import add_task
from prl_actors.tasks.code_task import code_task
from prl_actors.tasks.guess_task import guess_task
from prl_actors.tasks.jsonl import jsonl_task
from prl_actors.tasks.limits import limit_prompts
from prl_actors.tasks.math_task import math_task
from prl_actors.tasks.plugins import load_reward
from prl_actors.tasks.shaping import Overlong
from prl_actors.tasks.sim import sim_task

if TYPE_CHECKING:
    from prl_actors.config import Config
    from prl_actors.tasks.base import Task

TASKS: dict[str, Callable[[Config], Task]] = {
    "add": add_task,
    "jsonl": jsonl_task,
    "math": math_task,
    "code": code_task,
    "guess": guess_task,
}
TASK_NAMES = tuple(TASKS)
DATASET_TASKS = ("jsonl", "math", "code")
R = TypeVar("R")


def load_task(cfg: Config) -> Task:
    """The run's task: the sim bandit for the sim engine, else `task.name`, with its reward replaced
    by the `task.reward` plugin or the `task.rewards` list when one is set. On `run.resume`, the data
    must be those of the checkpoint to resume from (data/position.py). See docs/TASKS.md."""
    if cfg.worker.engine == "sim":
        task = sim_task(cfg)
    else:
        _check_options(cfg)
        task = TASKS[cfg.task.name](untemplated(cfg))
        loaded = task.items
        task.items, task.note = limit_prompts(untemplated(cfg), task.items, task.wheres)
        task.rows = kept_rows(loaded, task.items, task.rows)
        task.wheres = kept_rows(loaded, task.items, task.wheres)
    if cfg.task.reward:
        task.reward, task.rewards = load_reward(cfg.task.reward), None
    task.rewards = configure(cfg.task, task.reward_set())
    if cfg.task.reward and not cfg.task.rewards:  # the task's one plugin reward: under the plugins' deadline
        (own,) = task.rewards.rewards
        own.isolated, own.timeout_s, own.source = True, PLUGIN_TIMEOUT_S, cfg.task.reward
    if cfg.task.overlong_buffer and cfg.worker.engine != "sim":
        t = cfg.task
        task.overlong = Overlong(cfg.worker.sampling.max_new_tokens, t.overlong_buffer, t.overlong_penalty)
    if cfg.run.resume and cfg.worker.engine != "sim":
        check_resume(cfg, task)
    return task


def kept_rows(loaded: list[tuple[str, str]], kept: list[tuple[str, str]], rows: list[R]) -> list[R]:
    """The rows of the items `limit_prompts` kept (`kept` is a subsequence of `loaded`, in order; equal
    items have equal prompts, so they are kept or left out together)."""
    if not rows or len(kept) == len(loaded):
        return rows
    out, i = [], 0
    for item, row in zip(loaded, rows, strict=True):
        if i < len(kept) and item == kept[i]:
            out.append(row)
            i += 1
    return out


def untemplated(cfg: Config) -> Config:
    """Multi-turn runs keep the rows' plain text: the episode's renderer applies the chat template
    to the environment's messages (envs_llm/render.py). Other runs: `cfg` itself."""
    if not (cfg.task.multi_turn and cfg.task.chat_template):
        return cfg
    return cfg.model_copy(update={"task": cfg.task.model_copy(update={"chat_template": False, "system_prompt": None})})


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
    from prl_actors.records.rundir import CheckpointError, RunDir

    try:
        ckpt = RunDir(cfg.run.run_dir).latest_checkpoint()
    except CheckpointError:
        return  # no intact checkpoint: the trainer refuses to start and says why
    if ckpt is not None:
        position.verify(ckpt, task.data_identity(cfg.coordinator.groups_per_epoch, stride(cfg)))


def data_identity(cfg: Config) -> dict[str, Any]:
    """The identity of the run's prompt stream, as recorded in checkpoints (data/position.py)."""
    return load_task(cfg).data_identity(cfg.coordinator.groups_per_epoch, stride(cfg))


def stride(cfg: Config) -> int:
    """Stream positions per epoch (data/position.py): B, or B x max_sampling_rounds (dynamic sampling)."""
    c = cfg.coordinator
    return c.groups_per_epoch * (c.max_sampling_rounds if c.dynamic_sampling else 1)
