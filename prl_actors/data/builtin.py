"""The built-in tasks' data, below the model layer: the built-in models' warm start trains on it
(model/warmstart.py, model/tiny.py, the guess game's transcripts), and the tasks serve it as prompts.
Here so that model/ imports no task (tools/import_cycles.py)."""

from __future__ import annotations

from pathlib import Path

IGNORE = -100  # the label of a token the supervised warm start does not learn (HF's ignore index)
SAMPLES = Path(__file__).resolve().parent.parent / "tasks" / "data"  # package data of prl_actors.tasks


def add_items(max_operand: int) -> list[tuple[str, str]]:
    """Every (prompt, answer) pair of the `add` task, in a fixed order."""
    return [(f"{a}+{b}=", str(a + b)) for a in range(max_operand + 1) for b in range(max_operand + 1)]


def sample_file(name: str) -> str:
    """A shipped sample prompts file (`math_sample.jsonl`, `code_sample.jsonl`)."""
    return str(SAMPLES / name)
