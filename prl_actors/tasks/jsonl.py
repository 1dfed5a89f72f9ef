"""The `jsonl` task: (prompt, answer) pairs from `task.prompts_file`.

The file is JSONL, parquet or a local `datasets` directory (see data/rows.py); the prompt is read
from `task.prompt_field` (default "prompt") and the answer from `task.answer_field` (default
"answer"; a string, or a number turned into its string). Every problem is a `ConfigError` naming the
file and the row. Default reward: exact match after stripping whitespace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.sections import ConfigError
from prl_actors.tasks.base import Task, exact_match
from prl_actors.tasks.dataset import load_items_and_rows

if TYPE_CHECKING:
    from prl_actors.tasks.config import TaskSection


def jsonl_task(task: TaskSection, seed: int, model_path: str | None) -> Task:
    """`model_path`: model.path (its tokenizer's chat template, when task.chat_template)."""
    if not task.prompts_file:
        raise ConfigError(
            "task.name 'jsonl' needs task.prompts_file (a JSONL or parquet file, or a datasets directory)"
        )
    items, rows, wheres = load_items_and_rows(task, model_path, task.prompts_file, "prompt")
    return Task(items=items, reward=exact_match, seed=seed, name="jsonl", rows=rows, wheres=wheres)
