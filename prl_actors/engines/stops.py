"""Stop strings, as every engine and the buffer's group checks apply them (no torch import)."""

from __future__ import annotations


def cut_at_stop(text: str, stop: list[str]) -> str:
    """`text` up to (not including) the first occurrence of any stop string (vLLM's default); the
    tokens keep the one that completed it, as vLLM's token_ids do."""
    cuts = [i for i in (text.find(x) for x in stop) if i >= 0]
    return text[: min(cuts)] if cuts else text
