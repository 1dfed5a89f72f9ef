"""Prompt length limits, applied when a task's items are loaded (every actor loads them alike).

- `task.max_prompt_tokens`: longer prompts are left out, never cut; one line says how many and
  which row came first (a user's choice: a warning, not an error).
- the model's positions: a prompt longer than max_position_embeddings - max_new_tokens could never
  be generated in full (the torch engine would fail on it at every attempt, its group requeued
  forever), so such a dataset is refused at load with one line (count and first row), unless
  max_prompt_tokens already leaves those prompts out.
Lengths are in tokens of the run's tokenizer, after the chat template (encode_prompt, as the engines
encode them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prl_actors.sections import ConfigError

if TYPE_CHECKING:
    from prl_actors.tasks.config import TaskSection

BUILTIN_POSITIONS = 256  # model/builtin.py's max_position_embeddings


def prompt_lengths(model_path: str | None, chat_template: bool, prompts: list[str]) -> list[int]:
    """Token counts of `prompts` as the engines encode them (the tokenizer of `model_path`, model.path;
    `chat_template`: task.chat_template)."""
    from prl_actors.model.tokenizer import encode_prompt

    tok = _tokenizer(model_path)
    return [len(encode_prompt(tok, p, chat_template)) for p in prompts]


def _tokenizer(model_path: str | None) -> Any:
    if not model_path:
        from prl_actors.model.tokenizer import build_tokenizer

        return build_tokenizer()
    from prl_actors.model.builtin import validate_model_dir
    from prl_actors.model.tokenizer import load_tokenizer

    return load_tokenizer(validate_model_dir(model_path))


def model_positions(model_path: str | None, max_model_len: int | None = None) -> int | None:
    """Positions the model of `model_path` (model.path), or `max_model_len` (a vllm run's
    worker.max_model_len; None for other engines) when set, allows; None when its config does not say."""
    if max_model_len:
        return max_model_len
    if not model_path:
        return BUILTIN_POSITIONS
    config = json.loads((Path(model_path).expanduser() / "config.json").read_text())
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return None


def limit_prompts(
    t: TaskSection,
    model_path: str | None,
    items: list[tuple[str, str]],
    wheres: list[str] | None = None,
    *,
    max_new_tokens: int,
    max_model_len: int | None = None,
) -> tuple[list[tuple[str, str]], str]:
    """The items whose prompts fit, and the one line saying what was left out ('' when nothing).
    Raises ConfigError (one line) when a kept prompt cannot fit the positions of `model_path`'s model
    (model.path; or `max_model_len`, see model_positions) minus `max_new_tokens`
    (worker.sampling.max_new_tokens). `wheres[i]` names item i's place in its file; without them an
    item is named by its 1-based number."""
    name = _namer(wheres)
    lengths = prompt_lengths(model_path, t.chat_template, [p for p, _ in items])
    limit = t.max_prompt_tokens
    long = [i for i, n in enumerate(lengths) if limit is not None and n > limit]
    note = ""
    if long:
        note = (
            f"task.max_prompt_tokens {limit}: left out {len(long)} of {len(items)} prompts longer than that "
            f"(first: {name(long[0])}, {lengths[long[0]]} tokens)"
        )
    fit = [(i, n) for i, n in enumerate(lengths) if limit is None or n <= limit]
    _refuse_unfit(fit, name, model_positions(model_path, max_model_len), max_new_tokens)
    kept = [item for item, n in zip(items, lengths, strict=True) if limit is None or n <= limit]
    if not kept:
        raise ConfigError(f"{note}: no prompt is left")
    return kept, note


def _namer(wheres: list[str] | None) -> Callable[[int], str]:
    """Item index -> how an error names it: its file and line (or row), else 'prompt N' (1-based)."""
    return (lambda i: wheres[i]) if wheres else (lambda i: f"prompt {i + 1}")


def _refuse_unfit(
    lengths: list[tuple[int, int]], name: Callable[[int], str], positions: int | None, max_new_tokens: int
) -> None:
    if positions is None:
        return
    room = positions - max_new_tokens
    unfit = [(i, n) for i, n in lengths if n > room]
    if unfit:
        i, n = unfit[0]
        raise ConfigError(
            f"{len(unfit)} prompts are longer than the model's {positions} positions minus "
            f"worker.sampling.max_new_tokens {max_new_tokens} = {room} tokens (first: {name(i)}, "
            f"{n} tokens); set task.max_prompt_tokens <= {room} to leave them out, or lower max_new_tokens"
        )
