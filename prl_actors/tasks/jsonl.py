"""The `jsonl` task: (prompt, answer) pairs from `task.prompts_file`, one JSON object per line.

Each non-blank line must be an object with a string "prompt" and an "answer" (a string, or a number
that is turned into its string). Other keys are ignored. Every problem is a `ConfigError` naming
the file and the 1-based line number. Default reward: exact match after stripping whitespace.
"""

from __future__ import annotations

import json
from pathlib import Path

from prl_actors.config import Config, ConfigError
from prl_actors.tasks.base import Task, exact_match


def parse_line(line: str, where: str) -> tuple[str, str]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object with 'prompt' and 'answer'")
    prompt, answer = obj.get("prompt"), obj.get("answer")
    if not isinstance(prompt, str) or not prompt:
        raise ConfigError(f"{where}: 'prompt' must be a non-empty string")
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise ConfigError(f"{where}: 'answer' must be a string or a number")
    return prompt, str(answer)


def read_items(path: str | Path) -> list[tuple[str, str]]:
    """Every (prompt, answer) of the file, in file order."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"task.prompts_file {str(p)!r} does not exist")
    items = []
    with p.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                items.append(parse_line(line, f"{p}:{number}"))
    if not items:
        raise ConfigError(f"task.prompts_file {str(p)!r} holds no prompts")
    return items


def jsonl_task(cfg: Config) -> Task:
    if not cfg.task.prompts_file:
        raise ConfigError("task.name 'jsonl' needs task.prompts_file (a JSONL file of {prompt, answer})")
    return Task(items=read_items(cfg.task.prompts_file), reward=exact_match, seed=cfg.run.seed)
