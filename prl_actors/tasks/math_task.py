"""The `math` task: word problems with a numeric final answer (GSM8K-style).

Prompts: `task.prompts_file` (JSONL, parquet or a `datasets` directory; prompt field default
"question", answer field "answer"), or the shipped sample `tasks/data/math_sample.jsonl` when unset.
The reference answer may be a bare number or a worked solution ending in `#### x` (GSM8K's answer
column as is); it is reduced to its final number at load time, and a row without one is an error.

Reward: 1.0 when the response's final answer (see rewards/math_answer.py) equals the reference exactly, else
0.0, plus `task.format_reward` when the response marks its answer with `\\boxed{}` or `####`. The
bonus is < 1, so `accuracy` (reward >= 1) still counts exactly the correct responses.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from prl_actors.data.builtin import sample_file
from prl_actors.rewards.math_answer import canonical, extract_answer, has_final_answer_form, numbers
from prl_actors.tasks.base import Task
from prl_actors.tasks.dataset import load_items_and_rows

if TYPE_CHECKING:
    from prl_actors.tasks.config import TaskSection

SAMPLE = "math_sample.jsonl"


def sample_path() -> str:
    """The shipped sample file (package data)."""
    return sample_file(SAMPLE)


def reference_answer(raw: str) -> str:
    """The canonical final number of a reference answer; ValueError when it has none."""
    value = extract_answer(raw)
    if value is None:
        shown = raw if len(raw) <= 40 else raw[:37] + "..."
        raise ValueError(f"has no number: {shown!r}")
    return canonical(value)


def math_reward(prompt: str, response: str, answer: str, format_reward: float = 0.0) -> float:
    """1.0 for the right final answer, plus `format_reward` for an explicit final-answer form."""
    gold = numbers(answer)
    pred = extract_answer(response)
    correct = pred is not None and len(gold) == 1 and pred == gold[0]
    return float(correct) + (format_reward if has_final_answer_form(response) else 0.0)


def math_task(task: TaskSection, seed: int, model_path: str | None) -> Task:
    """`model_path`: model.path (its tokenizer's chat template, when task.chat_template)."""
    path = task.prompts_file or sample_path()
    items, rows, wheres = load_items_and_rows(task, model_path, path, "question", reference_answer)
    reward = partial(math_reward, format_reward=task.format_reward)
    return Task(items=items, reward=reward, seed=seed, name="math", rows=rows, wheres=wheres)
