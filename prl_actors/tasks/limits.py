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
    from prl_actors.config import Config

BUILTIN_POSITIONS = 256  # model/builtin.py's max_position_embeddings


def prompt_lengths(cfg: Config, prompts: list[str]) -> list[int]:
    """Token counts of `prompts` as the engines encode them."""
    from prl_actors.model.tokenizer import encode_prompt

    tok = _tokenizer(cfg)
    return [len(encode_prompt(tok, p, cfg.task.chat_template)) for p in prompts]


def _tokenizer(cfg: Config) -> Any:
    if not cfg.model.path:
        from prl_actors.model.tokenizer import build_tokenizer

        return build_tokenizer()
    from prl_actors.model.builtin import validate_model_dir
    from prl_actors.model.tokenizer import load_tokenizer

    return load_tokenizer(validate_model_dir(cfg.model.path))


def model_positions(cfg: Config) -> int | None:
    """Positions the model (or vLLM's max_model_len) allows; None when its config does not say."""
    if cfg.worker.engine == "vllm" and cfg.worker.max_model_len:
        return cfg.worker.max_model_len
    if not cfg.model.path:
        return BUILTIN_POSITIONS
    config = json.loads((Path(cfg.model.path).expanduser() / "config.json").read_text())
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return None


def limit_prompts(
    cfg: Config, items: list[tuple[str, str]], wheres: list[str] | None = None
) -> tuple[list[tuple[str, str]], str]:
    """The items whose prompts fit, and the one line saying what was left out ('' when nothing).
    Raises ConfigError (one line) when a kept prompt cannot fit the model's positions. `wheres[i]`
    names item i's place in its file; without them an item is named by its 1-based number."""
    name = _namer(wheres)
    lengths = prompt_lengths(cfg, [p for p, _ in items])
    limit = cfg.task.max_prompt_tokens
    long = [i for i, n in enumerate(lengths) if limit is not None and n > limit]
    note = ""
    if long:
        note = (
            f"task.max_prompt_tokens {limit}: left out {len(long)} of {len(items)} prompts longer than that "
            f"(first: {name(long[0])}, {lengths[long[0]]} tokens)"
        )
    _refuse_unfit(cfg, [(i, n) for i, n in enumerate(lengths) if limit is None or n <= limit], name)
    kept = [item for item, n in zip(items, lengths, strict=True) if limit is None or n <= limit]
    if not kept:
        raise ConfigError(f"{note}: no prompt is left")
    return kept, note


def _namer(wheres: list[str] | None) -> Callable[[int], str]:
    """Item index -> how an error names it: its file and line (or row), else 'prompt N' (1-based)."""
    return (lambda i: wheres[i]) if wheres else (lambda i: f"prompt {i + 1}")


def _refuse_unfit(cfg: Config, lengths: list[tuple[int, int]], name: Callable[[int], str]) -> None:
    positions = model_positions(cfg)
    if positions is None:
        return
    room = positions - cfg.worker.sampling.max_new_tokens
    unfit = [(i, n) for i, n in lengths if n > room]
    if unfit:
        i, n = unfit[0]
        raise ConfigError(
            f"{len(unfit)} prompts are longer than the model's {positions} positions minus "
            f"worker.sampling.max_new_tokens {cfg.worker.sampling.max_new_tokens} = {room} tokens (first: {name(i)}, "
            f"{n} tokens); set task.max_prompt_tokens <= {room} to leave them out, or lower max_new_tokens"
        )
