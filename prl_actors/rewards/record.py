"""The record a reward function receives: one per sample, frozen, the same for every kind of reward.

A per-sample reward is called as `fn(record) -> float`; a batched one (`batched: true`) as
`fn(records) -> list[float]` with the G records of one group (same prompt, same row), in sample order.
Either may be `async def`. See docs/TASKS.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

EMPTY_ROW: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class RewardInput:
    """One generated sample, as a reward sees it.

    prompt / completion: the text sent to the model and the decoded response (special tokens removed).
    prompt_ids / completion_ids: their token ids (the completion's exclude the prompt).
    answer: the row's reference answer ("" when the task has none).
    finished: the response ended with an end-of-sequence token; truncated = not finished
      (it ran into max_new_tokens).
    row: every column of the dataset row, read-only (e.g. `record.row["tests"]`); empty for the
      built-in `add` task and the sim.
    messages: the whole conversation of a multi-turn episode ({"role", "content"} dicts, in order);
      empty for single-turn tasks.
    group_id: the prompt's group id in its epoch; item: the row's index in the task's data (-1 when
      unknown); sample: the sample's position in its group.
    """

    prompt: str
    completion: str
    answer: str = ""
    prompt_ids: tuple[int, ...] = ()
    completion_ids: tuple[int, ...] = ()
    finished: bool = True
    row: Mapping[str, Any] = field(default_factory=lambda: EMPTY_ROW)
    messages: tuple[Mapping[str, Any], ...] = ()
    group_id: int = 0
    item: int = -1
    sample: int = 0

    @property
    def truncated(self) -> bool:
        """The response hit the token limit instead of ending on its own."""
        return not self.finished

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (the remote service's request, docs/TASKS.md)."""
        return {
            "prompt": self.prompt,
            "completion": self.completion,
            "answer": self.answer,
            "prompt_ids": list(self.prompt_ids),
            "completion_ids": list(self.completion_ids),
            "finished": self.finished,
            "truncated": self.truncated,
            "row": dict(self.row),
            "messages": [dict(m) for m in self.messages],
            "group_id": self.group_id,
            "item": self.item,
            "sample": self.sample,
        }


def read_only(row: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A read-only copy of a dataset row or a message (rewards must not change what the next sample
    sees)."""
    return EMPTY_ROW if not row else MappingProxyType(dict(row))
