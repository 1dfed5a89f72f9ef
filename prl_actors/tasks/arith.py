"""The built-in `add` task: "a+b=" -> the decimal sum, with 0 <= a, b <= task.max_operand.

Reward: 1.0 when the response (special tokens stripped, surrounding whitespace ignored) is exactly
the sum, else 0.0; no partial credit, so `accuracy` and `reward_mean` coincide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.data.builtin import add_items
from prl_actors.tasks.base import Task

if TYPE_CHECKING:
    from prl_actors.tasks.config import TaskSection

__all__ = ["add_items", "add_reward", "add_task"]  # add_items: data/builtin.py (the warm start uses it too)


def add_reward(prompt: str, response: str, answer: str) -> float:
    return 1.0 if response.strip() == answer.strip() else 0.0


def add_task(task: TaskSection, seed: int) -> Task:
    return Task(items=add_items(task.max_operand), reward=add_reward, seed=seed, name="add")
