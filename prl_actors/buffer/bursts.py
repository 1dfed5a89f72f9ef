"""Bursts, a part of the buffer: the groups workers announced will follow (GroupResult.follows), which
let the trainer (trainer/scheduling.py) know an epoch is generated before its last group arrives."""

from __future__ import annotations


class Bursts:
    """The buffer's count of groups announced by workers' bursts (GroupResult.follows): per worker,
    how many more groups it said follow its last accepted one (each clamped to 0..B)."""

    def __init__(self) -> None:
        self.following: dict[str, int] = {}  # worker -> groups it said follow its last accepted one

    def reset(self) -> None:
        """A new epoch: nothing announced."""
        self.following = {}

    def accepted(self, worker: str, follows: int, groups: int) -> None:
        """`worker`'s group was accepted, announcing `follows` more (a newer count replaces the last)."""
        self.following[worker] = min(max(follows, 0), groups)

    def generated(self, in_hand: int, groups: int) -> bool:
        """Is every one of the epoch's `groups` in hand (accepted or dropped) or announced?"""
        return in_hand + sum(self.following.values()) >= groups
