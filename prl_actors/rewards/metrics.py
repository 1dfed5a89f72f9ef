"""Per-reward and per-episode means of an epoch, from the groups the trainer consumed.

- `reward/<name>`: each configured reward's mean (task.rewards; samples without parts add nothing).
- `episode/*` (multi-turn runs, samples that carry Sample.episode): per episode, the mean number of
  model `turns`, of `tool_calls` and `tool_errors` (calls answered with an error), of
  `env_tokens` (observation tokens in the context, never trained) and `turn_tokens` (the model's
  tokens per turn: its trained tokens / its turns).

Invariant: a mean covers exactly the samples of the groups added since the last reset (the epoch's
trained groups), whatever their arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Group, Sample

EPISODE_KEYS = ("turns", "tool_calls", "tool_errors", "env_tokens", "turn_tokens")


@dataclass
class RewardMeans:
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    episode_sums: dict[str, float] = field(default_factory=dict)
    episodes: int = 0

    def reset(self) -> None:
        self.sums.clear()
        self.counts.clear()
        self.episode_sums.clear()
        self.episodes = 0

    def add(self, group: Group) -> None:
        for sample in group.samples:
            for name, value in sample.reward_parts.items():
                self.sums[name] = self.sums.get(name, 0.0) + value
                self.counts[name] = self.counts.get(name, 0) + 1
            if sample.episode is not None:
                self._add_episode(sample)

    def _add_episode(self, sample: Sample) -> None:
        e = sample.episode
        assert e is not None
        model = sum(sample.model_mask())
        values = (e.turns, e.tool_calls, e.tool_errors, len(sample.token_ids) - model, model / max(1, e.turns))
        for key, value in zip(EPISODE_KEYS, values, strict=True):
            self.episode_sums[key] = self.episode_sums.get(key, 0.0) + value
        self.episodes += 1

    def metrics(self) -> dict[str, float]:
        """{"reward/<name>": mean} in name order, then {"episode/<key>": mean} (each empty when no
        sample carried parts / episode counts)."""
        out = {f"reward/{name}": self.sums[name] / self.counts[name] for name in sorted(self.sums)}
        if self.episodes:
            out.update({f"episode/{k}": self.episode_sums[k] / self.episodes for k in EPISODE_KEYS})
        return out
