"""Items of the dataset tasks (jsonl, math): rows -> field mapping -> checks -> chat template."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prl_actors.data.items import AnswerFn, Item, apply_chat_template, build_items
from prl_actors.data.rows import read_rows
from prl_actors.sections import ConfigError

if TYPE_CHECKING:
    from prl_actors.tasks.config import TaskSection


def load_items(
    t: TaskSection, model_path: str | None, path: str, default_prompt_field: str, answer_fn: AnswerFn | None = None
) -> list[tuple[str, str]]:
    """Every (prompt, answer) of `path`, in row order, templated when `task.chat_template` is set
    (with the tokenizer of `model_path`, model.path). Any bad row is a ConfigError naming the file
    and the row."""
    return load_items_and_rows(t, model_path, path, default_prompt_field, answer_fn)[0]


def load_items_and_rows(
    t: TaskSection, model_path: str | None, path: str, default_prompt_field: str, answer_fn: AnswerFn | None = None
) -> tuple[list[tuple[str, str]], list[Mapping[str, Any]], list[str]]:
    """load_items, plus every row with all its columns (aligned with the items: what rewards read
    as `record.row`) and where each row stands in its file (for error messages)."""
    prompt_field = t.prompt_field or default_prompt_field
    rows = read_rows(path, [prompt_field, t.answer_field], t.split, all_columns=True)
    items = build_items(rows, prompt_field, t.answer_field, path, answer_fn)
    return template(t, model_path, items), [fields for _, fields in rows], [where for where, _ in rows]


def template(t: TaskSection, model_path: str | None, items: list[Item]) -> list[tuple[str, str]]:
    """(prompt, answer) pairs, the prompts wrapped in the chat template of `model_path`'s tokenizer
    when `task.chat_template`."""
    if t.chat_template:
        items = apply_chat_template(items, chat_tokenizer(model_path), t.system_prompt, str(model_path))
    return [(item.prompt, item.answer) for item in items]


def chat_tokenizer(model_path: str | None) -> Any:
    """The tokenizer of `model_path`, model.path (never downloads); the built-in model has no chat template."""
    if not model_path:
        raise ConfigError(
            "task.chat_template needs model.path: the built-in tiny model's tokenizer has no chat template"
        )
    from prl_actors.model.builtin import validate_model_dir
    from prl_actors.model.tokenizer import load_tokenizer

    return load_tokenizer(validate_model_dir(model_path))
