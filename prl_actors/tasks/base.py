"""The Task interface: a fixed list of (prompt, answer) items, an epoch sampler, a reward.

Imports no task module (the registry, tasks/registry.py, imports them all).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prl_actors.data.sampler import EpochSampler
from prl_actors.protocol.messages import Prompt

RewardFn = Callable[[str, str, str], float]
"""reward(prompt, response, answer) -> float. See docs/TASKS.md."""


def exact_match(prompt: str, response: str, answer: str) -> float:
    return 1.0 if response.strip() == answer.strip() else 0.0


@dataclass
class Task:
    """(prompt, answer) items sampled per epoch without replacement, plus a reward function.

    Invariant: `prompts_for_epoch(e, n)` depends only on (seed, e, n, items): every item is used
    once per pass over the items before any repeats (see data/sampler.py)."""

    items: list[tuple[str, str]]
    reward: RewardFn
    seed: int = 0
    name: str = ""
    overlong: Callable[[int], float] | None = None  # length -> reward shaping (tasks/shaping.py), set by load_task
    note: str = ""  # what loading left out (tasks/limits.py), one line for the log and the console
    _sampler: EpochSampler | None = field(default=None, init=False, repr=False, compare=False)

    def prompts_for_epoch(self, epoch: int, n: int) -> list[Prompt]:
        """The epoch's n prompts; group ids are 0..n-1."""
        if self._sampler is None or self._sampler.size != len(self.items):
            self._sampler = EpochSampler(self.seed, len(self.items))
        picks = [self.items[i] for i in self._sampler.indices(epoch, n)]
        return [Prompt(group_id=i, prompt=p, answer=a) for i, (p, a) in enumerate(picks)]

    def prompts_at(self, start: int, ids: list[int]) -> list[Prompt]:
        """Group id g's prompt is the one at stream position start + g (dynamic sampling's rounds)."""
        if self._sampler is None or self._sampler.size != len(self.items):
            self._sampler = EpochSampler(self.seed, len(self.items))
        picks = [self.items[self._sampler.at(start + g)] for g in ids]
        return [Prompt(group_id=g, prompt=p, answer=a) for g, (p, a) in zip(ids, picks, strict=True)]

    def score(self, prompt: Prompt, response: str) -> float:
        return float(self.reward(prompt.prompt, response, prompt.answer))

    def length_penalty(self, length: int) -> float:
        """What the worker adds to a response's reward for its `length` tokens (the overlong
        penalty, tasks/shaping.py; 0 when off)."""
        return self.overlong(length) if self.overlong is not None else 0.0

    def fingerprint(self) -> str:
        """sha256 of every (prompt, answer) in order: the identity of what is sampled."""
        h = hashlib.sha256()
        for prompt, answer in self.items:
            h.update(prompt.encode())
            h.update(b"\0")
            h.update(answer.encode())
            h.update(b"\0")
        return h.hexdigest()

    def data_identity(self, groups_per_epoch: int, epoch_stride: int = 0) -> dict[str, Any]:
        from prl_actors.data.position import identity

        return identity(self.name, self.seed, groups_per_epoch, len(self.items), self.fingerprint(), epoch_stride)
