"""Minibatches of an epoch by group index, and the learning-rate schedule (pure code, no torch).

Invariants (what keeps periodic == sync with M minibatches and mu passes):
* minibatch k holds exactly the groups with `group_id * M // B == k` (B groups, ids 0..B-1): fixed by
  index before any group arrives, never by arrival order;
* minibatch k of the first pass trains only once minibatches < k have stepped; its groups that arrive
  earlier wait (held, not trained), so each minibatch's gradient is taken at the same weights, on the
  same groups, in either mode;
* the old policy of every step of an epoch is the frozen epoch-start policy (training/grpo.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Generic, TypeVar

G = TypeVar("G")


@dataclass(frozen=True)
class MinibatchPlan:
    """B groups split into M contiguous, near-equal minibatches by group index."""

    groups: int
    minibatches: int

    def index(self, group_id: int) -> int:
        """The minibatch of `group_id` (an id outside 0..B-1 goes to the last one: trained at the step)."""
        if self.groups <= 0 or not 0 <= group_id < self.groups:
            return self.minibatches - 1
        return group_id * self.minibatches // self.groups

    def size(self, k: int) -> int:
        """How many of the ids 0..B-1 minibatch k holds."""
        return sum(1 for g in range(self.groups) if self.index(g) == k)


@dataclass
class EpochRun(Generic[G]):
    """The groups of one epoch by minibatch, and how far the first pass got (`open`: the minibatch
    being trained; every held group of it is queued for training once `gated` is false)."""

    plan: MinibatchPlan
    held: list[list[G]] = field(default_factory=list)
    open: int = 0
    arrived: int = 0
    gated: bool = False  # scale_rewards batch: nothing trains before every group is in

    def __post_init__(self) -> None:
        self.held = [[] for _ in range(self.plan.minibatches)]

    def add(self, group_id: int, group: G) -> int:
        k = self.plan.index(group_id)
        self.held[k].append(group)
        self.arrived += 1
        return k

    def all_in(self) -> bool:
        return self.arrived >= self.plan.groups

    def can_step_early(self) -> bool:
        """The open minibatch is complete and not the last one (the last steps at the epoch's step)."""
        k = self.open
        return not self.gated and k < self.plan.minibatches - 1 and len(self.held[k]) == self.plan.size(k)


def lr_factor(schedule: str, epoch: int, warmup: int, horizon: int) -> float:
    """The learning rate of `epoch` (0-based: the epochs trained before it) relative to trainer.lr:
    warm-up (e + 1) / (W + 1) for e < W, then constant, or linear / cosine decay from 1 at e = W to 0
    at e = horizon (run.epochs, saved with checkpoints)."""
    if epoch < warmup:
        return (epoch + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (epoch - warmup) / max(horizon - warmup, 1))
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))
