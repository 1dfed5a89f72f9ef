"""Per-reward means of an epoch, from the groups the trainer consumed: `reward/<name>` in metrics.jsonl.

Invariant: a mean covers exactly the samples of the groups added since the last reset (the epoch's
trained groups), whatever their arrival order; samples without parts (a task's one default reward)
add nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prl_actors.protocol.messages import Group


@dataclass
class RewardMeans:
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def reset(self) -> None:
        self.sums.clear()
        self.counts.clear()

    def add(self, group: Group) -> None:
        for sample in group.samples:
            for name, value in sample.reward_parts.items():
                self.sums[name] = self.sums.get(name, 0.0) + value
                self.counts[name] = self.counts.get(name, 0) + 1

    def metrics(self) -> dict[str, float]:
        """{"reward/<name>": mean} in name order (empty when no sample carried parts)."""
        return {f"reward/{name}": self.sums[name] / self.counts[name] for name in sorted(self.sums)}
