"""The built-in `guess` task: the number-guessing game (envs_llm/guess.py), one row per secret.
Its episodes carry their own reward; the task's single-turn reward is never asked for (0.0)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.envs_llm.guess import guess_items
from prl_actors.tasks.base import Task

if TYPE_CHECKING:
    from prl_actors.tasks.config import TaskSection


def no_single_turn_reward(prompt: str, response: str, answer: str) -> float:
    return 0.0


def guess_task(task: TaskSection, seed: int) -> Task:
    return Task(items=guess_items(task.guess_max), reward=no_single_turn_reward, seed=seed, name="guess")
