"""The task registry: `task.name` -> the task's builder. The only module that imports them all."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

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
    from pathlib import Path

    from prl_actors.tasks.base import Task
    from prl_actors.tasks.config import TaskSection

TaskBuilder = Callable[["TaskSection", int, "str | None"], "Task"]
"""(task section, run.seed, model.path) -> the task."""
TASKS: dict[str, TaskBuilder] = {
    "add": lambda t, seed, model_path: add_task(t, seed),
    "jsonl": jsonl_task,
    "math": math_task,
    "code": code_task,
    "guess": lambda t, seed, model_path: guess_task(t, seed),
}
TASK_NAMES = tuple(TASKS)
DATASET_TASKS = ("jsonl", "math", "code")
R = TypeVar("R")


def load_task(
    t: TaskSection,
    seed: int,
    *,
    model_path: str | None,
    max_new_tokens: int,
    max_model_len: int | None = None,
    sim_arms: int | None = None,
) -> Task:
    """The run's task: the sim bandit of `sim_arms` arms for the sim engine (sim.arms; None for the
    other engines), else `task.name`, with its reward replaced by the `task.reward` plugin or the
    `task.rewards` list when one is set. `seed`: run.seed; `model_path`: model.path (the tokenizer of
    the prompt limits and the chat template); `max_new_tokens`: worker.sampling.max_new_tokens;
    `max_model_len`: a vllm run's worker.max_model_len (None for other engines). On `run.resume`,
    the caller checks the data against the checkpoint's (`check_resume`). See docs/TASKS.md."""
    if sim_arms is not None:
        task = sim_task(sim_arms, seed)
    else:
        _check_options(t)
        plain = untemplated(t)
        task = TASKS[t.name](plain, seed, model_path)
        loaded = task.items
        task.items, task.note = limit_prompts(
            plain, model_path, task.items, task.wheres, max_new_tokens=max_new_tokens, max_model_len=max_model_len
        )
        task.rows = kept_rows(loaded, task.items, task.rows)
        task.wheres = kept_rows(loaded, task.items, task.wheres)
    if t.reward:
        task.reward, task.rewards = load_reward(t.reward), None
    task.rewards = configure(t, task.reward_set())
    if t.reward and not t.rewards:  # the task's one plugin reward: under the plugins' deadline
        (own,) = task.rewards.rewards
        own.isolated, own.timeout_s, own.source = True, PLUGIN_TIMEOUT_S, t.reward
    if t.overlong_buffer and sim_arms is None:
        task.overlong = Overlong(max_new_tokens, t.overlong_buffer, t.overlong_penalty)
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


def untemplated(t: TaskSection) -> TaskSection:
    """Multi-turn runs keep the rows' plain text: the episode's renderer applies the chat template
    to the environment's messages (envs_llm/render.py). Other runs: `t` itself."""
    if not (t.multi_turn and t.chat_template):
        return t
    return t.model_copy(update={"chat_template": False, "system_prompt": None})


def _check_options(t: TaskSection) -> None:
    if t.name not in TASKS:
        raise ConfigError(f"unknown task {t.name!r}: use one of {', '.join(TASK_NAMES)}")
    if t.name not in DATASET_TASKS:
        for option, value in (("prompts_file", t.prompts_file), ("chat_template", t.chat_template)):
            if value:
                names = f"{', '.join(DATASET_TASKS[:-1])} and {DATASET_TASKS[-1]}"
                raise ConfigError(f"task.{option} applies to the {names} tasks, not {t.name!r}")
    if t.format_reward and t.name != "math":
        raise ConfigError("task.format_reward applies to the math task only")


def check_resume(task: Task, run_dir: str | Path, groups_per_epoch: int, stride: int) -> None:
    """Refuse to resume from a checkpoint in `run_dir` whose data identity differs (a changed file,
    seed, B, ...): `groups_per_epoch` (B) and `stride` (training/dynamic_sampling.epoch_stride) as the run has them."""
    from prl_actors.data import position
    from prl_actors.records.rundir import CheckpointError, RunDir

    try:
        ckpt = RunDir(run_dir).latest_checkpoint()
    except CheckpointError:
        return  # no intact checkpoint: the trainer refuses to start and says why
    if ckpt is not None:
        position.verify(ckpt, task.data_identity(groups_per_epoch, stride))
