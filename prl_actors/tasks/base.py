"""The Task interface: a fixed list of (prompt, answer) items (with their dataset rows), an epoch
sampler, and rewards.

Imports no task module (the registry, tasks/registry.py, imports them all).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prl_actors.data.sampler import EpochSampler
from prl_actors.protocol.messages import Prompt
from prl_actors.rewards.combine import RewardSet, Scored
from prl_actors.rewards.errors import RewardError, where
from prl_actors.rewards.record import EMPTY_ROW, RewardInput, read_only
from prl_actors.rewards.reward import Reward, legacy

ENV_PART = "env"  # the reward_parts name of a multi-turn episode's own (environment) reward
RewardFn = Callable[[str, str, str], float]
"""reward(prompt, response, answer) -> float. See docs/TASKS.md."""


def exact_match(prompt: str, response: str, answer: str) -> float:
    return 1.0 if response.strip() == answer.strip() else 0.0


class Generated(Protocol):
    """What scoring reads of a generated sample (engines' GeneratedSample; multi-turn samples may
    also carry `messages`, the whole conversation)."""

    text: str
    token_ids: list[int]
    finished: bool


@dataclass
class Task:
    """(prompt, answer) items sampled per epoch without replacement, plus rewards.

    Invariant: `prompts_for_epoch(e, n)` depends only on (seed, e, n, items): every item is used
    once per pass over the items before any repeats (see data/sampler.py).
    `rows[i]` (when given) is item i's dataset row with all its columns, `wheres[i]` where it stands
    (a JSONL file's 1-based line, another format's 0-based row); `rewards` (set by
    load_task from `task.rewards`) replaces `reward`, the task's own (prompt, response, answer) one."""

    items: list[tuple[str, str]]
    reward: RewardFn
    seed: int = 0
    name: str = ""
    rows: list[Mapping[str, Any]] = field(default_factory=list)
    wheres: list[str] = field(default_factory=list)  # item i's place in its file ("data.jsonl:7"), for errors
    rewards: RewardSet | None = None
    overlong: Callable[[int], float] | None = None  # length -> reward shaping (tasks/shaping.py), set by load_task
    note: str = ""  # what loading left out (tasks/limits.py), one line for the log and the console
    _sampler: EpochSampler | None = field(default=None, init=False, repr=False, compare=False)

    def prompts_for_epoch(self, epoch: int, n: int) -> list[Prompt]:
        """The epoch's n prompts; group ids are 0..n-1."""
        if self._sampler is None or self._sampler.size != len(self.items):
            self._sampler = EpochSampler(self.seed, len(self.items))
        picks = self._sampler.indices(epoch, n)
        return [
            Prompt(group_id=g, prompt=self.items[i][0], answer=self.items[i][1], item=i) for g, i in enumerate(picks)
        ]

    def reward_set(self) -> RewardSet:
        """`rewards`, or the task's own reward alone (named after the task) when none were configured."""
        if self.rewards is None:
            self.rewards = RewardSet([Reward(self.name or "reward", legacy(self.reward))])
        return self.rewards

    def prompts_at(self, start: int, ids: list[int]) -> list[Prompt]:
        """Group id g's prompt is the one at stream position start + g (dynamic sampling's rounds)."""
        if self._sampler is None or self._sampler.size != len(self.items):
            self._sampler = EpochSampler(self.seed, len(self.items))
        picks = [self._sampler.at(start + g) for g in ids]
        return [
            Prompt(group_id=g, prompt=self.items[i][0], answer=self.items[i][1], item=i)
            for g, i in zip(ids, picks, strict=True)
        ]

    def score(self, prompt: Prompt, response: str) -> float:
        """One response's total reward (no token ids: for checks and tools; workers use score_group)."""
        return self.score_group(prompt, [], [_Text(response)]).totals[0]

    def score_group(self, prompt: Prompt, prompt_ids: Sequence[int], samples: Sequence[Generated]) -> Scored:
        """The G samples' rewards (blocking: runs its own event loop). Raises RewardError (one line)
        when a reward fails under `task.on_reward_error: fail`, or when this task's data disagree
        with the prompt's row index."""
        return self.reward_set().score(self.records(prompt, prompt_ids, samples))

    def score_generated(self, prompt: Prompt, prompt_ids: Sequence[int], samples: Sequence[Generated]) -> Scored:
        """score_group for samples that may bring their own reward (a multi-turn episode's, from its
        environment: `sample.reward` not None). Such a sample's total is its own reward, plus the
        weighted `task.rewards` when they are configured (its own then reported as the part `env`);
        without `task.rewards` the task's reward is not asked for it."""
        own = [getattr(s, "reward", None) for s in samples]
        rewards = self.reward_set()
        if all(r is not None for r in own) and not rewards.report_parts:
            return Scored([float(r) for r in own if r is not None], [{} for _ in own])
        scored = self.score_group(prompt, prompt_ids, samples)
        for i, r in enumerate(own):
            if r is not None and rewards.report_parts:
                scored.totals[i] += r
                scored.parts[i][ENV_PART] = float(r)
            elif r is not None:
                scored.totals[i] = float(r)
        return scored

    async def score_group_async(
        self, prompt: Prompt, prompt_ids: Sequence[int], samples: Sequence[Generated]
    ) -> Scored:
        """score_group for a caller that runs an event loop of its own (e.g. multi-turn episodes)."""
        return await self.reward_set().score_async(self.records(prompt, prompt_ids, samples))

    def records(self, prompt: Prompt, prompt_ids: Sequence[int], samples: Sequence[Generated]) -> list[RewardInput]:
        """One RewardInput per sample; a sample's `messages` (multi-turn) is carried when it has one."""
        row = read_only(self.row(prompt))
        return [
            RewardInput(
                prompt=prompt.prompt,
                completion=s.text,
                answer=prompt.answer,
                prompt_ids=tuple(prompt_ids),
                completion_ids=tuple(s.token_ids),
                finished=s.finished,
                row=row,
                messages=tuple(read_only(m) for m in getattr(s, "messages", None) or ()),
                group_id=prompt.group_id,
                item=prompt.item,
                sample=j,
            )
            for j, s in enumerate(samples)
        ]

    def row(self, prompt: Prompt) -> Mapping[str, Any]:
        """The dataset row of `prompt` (empty for tasks without rows or an unknown index)."""
        if not self.rows or prompt.item < 0:
            return EMPTY_ROW
        if prompt.item >= len(self.rows) or self.items[prompt.item][0] != prompt.prompt:
            raise RewardError(
                f"{where(prompt.group_id, prompt.item, None)} is not that row of this worker's data: "
                "the worker and the coordinator must load the same task data"
            )
        return self.rows[prompt.item]

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


@dataclass
class _Text:
    """A bare response (Task.score): text only, no token ids."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    finished: bool = True
