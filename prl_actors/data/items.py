"""(prompt, answer) items from rows: the field mapping, per-row checks, the chat template.

Every problem is found here, at load time, before any actor trains: a `ConfigError` that names the
file and the row (`where`), e.g. `gsm8k.parquet: row 12: 'question' must be a non-empty string`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prl_actors.sections import ConfigError

if TYPE_CHECKING:
    from prl_actors.data.rows import Row

AnswerFn = Callable[[str], str]
"""Turns a raw answer string into the stored one; raises ValueError (the reason) for a bad answer."""


@dataclass(frozen=True)
class Item:
    """One prompt of the dataset and where it came from (for error messages)."""

    where: str
    prompt: str
    answer: str


def build_items(
    rows: Sequence[Row], prompt_field: str, answer_field: str, source: str, answer_fn: AnswerFn | None = None
) -> list[Item]:
    """One Item per row, in row order; `source` names the file when it holds no rows at all."""
    items = [_item(where, fields, prompt_field, answer_field, answer_fn) for where, fields in rows]
    if not items:
        raise ConfigError(f"task.prompts_file {source!r} holds no prompts")
    return items


def _item(
    where: str, fields: Mapping[str, Any], prompt_field: str, answer_field: str, answer_fn: AnswerFn | None
) -> Item:
    prompt, answer = fields.get(prompt_field), fields.get(answer_field)
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError(f"{where}: {prompt_field!r} must be a non-empty string")
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise ConfigError(f"{where}: {answer_field!r} must be a string or a number")
    text = str(answer)
    if answer_fn is not None:
        try:
            text = answer_fn(text)
        except ValueError as exc:
            raise ConfigError(f"{where}: {answer_field!r} {exc}") from None
    return Item(where, prompt, text)


def apply_chat_template(items: Sequence[Item], tokenizer: Any, system_prompt: str | None, name: str) -> list[Item]:
    """Each prompt rendered as [system?, user] with the generation prompt appended (text, not ids:
    engines tokenise it without adding special tokens again, see model.tokenizer.encode_prompt)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"task.chat_template is true but the tokenizer of {name} has no chat template "
            "(add one to tokenizer_config.json / chat_template.jinja, or set task.chat_template: false)"
        )
    return [_render(item, tokenizer, system_prompt) for item in items]


def _render(item: Item, tokenizer: Any, system_prompt: str | None) -> Item:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    messages.append({"role": "user", "content": item.prompt})
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # a jinja template may raise anything (e.g. "roles must alternate")
        raise ConfigError(f"{item.where}: the chat template failed on this row ({exc})") from None
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{item.where}: the chat template rendered no text")
    return Item(item.where, text, item.answer)
