"""The `code` task: write a Python function; the reward runs it against the row's tests.

Rows (JSONL, parquet or a `datasets` directory; `task.prompts_file`, or the shipped sample
`tasks/data/code_sample.jsonl` when unset): a prompt (field `task.prompt_field`, default "prompt")
and tests (field `task.tests_field`, default "tests": a list of Python statements, usually asserts,
MBPP's `test_list` style); an optional `test_setup` column is run after the program (imports the
tests need). Every other column is kept for rewards (`record.row`).

Reward: the fraction of tests the completion's last ```python block passes, run in the sandbox of
rewards/code.py (bubblewrap: time limit `task.code_timeout_s`, memory `task.code_memory_mb`, no
network, a private tmpfs; refused at load without bubblewrap unless `task.code_unsafe_local`;
docs/SECURITY.md says what is and is not isolated).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import TYPE_CHECKING

from prl_actors.data.items import Item
from prl_actors.data.rows import Row, read_rows
from prl_actors.rewards import sandbox
from prl_actors.rewards.builtins import code
from prl_actors.rewards.combine import RewardSet
from prl_actors.rewards.reward import Reward
from prl_actors.sections import ConfigError
from prl_actors.tasks.base import Task
from prl_actors.tasks.dataset import template

if TYPE_CHECKING:
    from prl_actors.tasks.config import TaskSection

SAMPLE = "code_sample.jsonl"


def sample_path() -> str:
    return str(resources.files("prl_actors.tasks").joinpath("data", SAMPLE))


def code_task(t: TaskSection, seed: int, model_path: str | None) -> Task:
    """`model_path`: model.path (its tokenizer's chat template, when task.chat_template)."""
    path = t.prompts_file or sample_path()
    prompt_field = t.prompt_field or "prompt"
    rows = read_rows(path, [prompt_field, t.tests_field], t.split, all_columns=True)
    if not rows:
        raise ConfigError(f"task.prompts_file {path!r} holds no prompts")
    items = template(t, model_path, [_item(row, prompt_field, t.tests_field) for row in rows])
    try:
        sandbox.require(t.code_unsafe_local)
    except sandbox.SandboxUnavailable as exc:
        raise ConfigError(str(exc)) from None
    fn = functools.partial(
        code, timeout_s=t.code_timeout_s, memory_mb=t.code_memory_mb, tests_field=t.tests_field,
        unsafe_local=t.code_unsafe_local,
    )  # fmt: skip
    task = Task(items=items, reward=_no_legacy, seed=seed, name="code", rows=[r for _, r in rows])
    task.wheres = [where for where, _ in rows]
    task.rewards = RewardSet([Reward("code", fn, source="builtin code")])
    return task


def _item(row: Row, prompt_field: str, tests_field: str) -> Item:
    where, fields = row
    prompt, tests = fields.get(prompt_field), fields.get(tests_field)
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError(f"{where}: {prompt_field!r} must be a non-empty string")
    if isinstance(tests, str):
        tests = [tests]
    if not isinstance(tests, list | tuple) or not tests or not all(isinstance(x, str) for x in tests):
        raise ConfigError(f"{where}: {tests_field!r} must be a non-empty list of Python statements (strings)")
    return Item(where, prompt, "")


def _no_legacy(prompt: str, response: str, answer: str) -> float:
    """The code task scores with its row's tests (task.rewards), never with (prompt, response, answer)."""
    raise ValueError("the code task's reward needs the row's tests: use task.rewards or the default")
