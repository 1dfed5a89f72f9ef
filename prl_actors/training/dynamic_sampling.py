"""Dynamic sampling (DAPO), `coordinator.dynamic_sampling`: the rule, as plain code.

A group whose rewards are all equal has zero advantage everywhere: it teaches nothing, yet it would
count in the loss normaliser. With dynamic sampling such a group is accepted (exactly once, like any
other) but not trained, and the epoch hands out more prompts until it has B informative groups:

- round 0 is the epoch's B groups (ids 0..B-1); when every group handed out so far is accepted and
  only k < B of them are informative, round r + 1 hands out B - k more (the next ids), so every
  informative group is kept (there are never more than B) and streams to the trainer on arrival;
- after `max_sampling_rounds` rounds the epoch trains what it has (fewer than B groups) and says so;
- group id g of epoch e is the prompt at stream position e * W + g, W = B * max_sampling_rounds (the
  most ids an epoch can use): prompts are a pure function of (epoch, group id), so periodic and sync,
  a requeued group, a restarted coordinator and `replay` all see the same prompts. Positions of the
  window an epoch does not use are skipped (data/position.py records the position with stride W).
Whether a round follows depends only on the rewards of the groups before it, which are the same in
periodic and sync mode (same weights, same counter-based samples).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def informative(rewards: Sequence[float]) -> bool:
    """Do the group's rewards differ (a non-zero advantage somewhere)?"""
    return len(rewards) > 0 and max(rewards) != min(rewards)


def epoch_stride(groups_per_epoch: int, dynamic: bool, max_rounds: int) -> int:
    """Stream positions one epoch spans: B, or B x max_sampling_rounds with dynamic sampling."""
    return groups_per_epoch * (max_rounds if dynamic else 1)


@dataclass
class Rounds:
    """One epoch's rounds: which groups were handed out in which round, which proved informative."""

    target: int  # B
    max_rounds: int
    ends: list[int] = field(default_factory=list)  # round r covers ids [ends[r-1], ends[r])
    informative: set[int] = field(default_factory=set)
    accepted: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not self.ends:
            self.ends = [self.target]

    @property
    def handed_out(self) -> int:
        return self.ends[-1]

    @property
    def kept(self) -> int:
        return len(self.informative)

    def accept(self, group_id: int, is_informative: bool) -> None:
        self.accepted.add(group_id)
        if is_informative:
            self.informative.add(group_id)

    def next_round(self) -> list[int]:
        """The ids of the next round, once every id handed out is accepted; [] when the epoch is
        complete: B informative groups, or `max_rounds` rounds done."""
        missing = self.target - self.kept
        if missing <= 0 or len(self.ends) >= self.max_rounds or len(self.accepted) < self.handed_out:
            return []
        start = self.handed_out
        self.ends.append(start + missing)
        return list(range(start, start + missing))

    @property
    def short(self) -> bool:
        """The epoch ended with fewer than B informative groups (its rounds ran out)."""
        return self.kept < self.target
