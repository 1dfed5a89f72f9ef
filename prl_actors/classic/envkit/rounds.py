"""Acting rounds on the learner's side (DETACH): which slots a round waits for, what arrived, what was lost.

Round r opens when the policy version that acts in it is published; every live env actor is expected to
send one Segment for exactly the slots it owns at that moment. Invariants:
- a slot of round r is received (in exactly one segment) or lost (its actor left or went silent
  before sending it), never both, never twice; a lost slot's episode is counted truncated;
- the round is complete when no expected slot is outstanding; only then is it handed to the learner,
  which trains each received segment exactly once;
- a segment for another round, from an actor not expected, or for other slots than expected is
  refused with a reason (logged by the caller), never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prl_actors.classic.envkit.arrays import Array


@dataclass
class Received:
    actor: str
    slots: list[int]
    version: int
    arrays: dict[str, Array]
    returns: list[float]
    lengths: list[int]
    sync_kl: float
    synced: bool


@dataclass
class RoundBatch:
    """A complete round, as the learner trains it."""

    round: int
    version: int  # the version published for the round
    segments: list[Received]
    lost_slots: list[int]
    stats: dict[str, Any] = field(default_factory=dict)


class RoundBook:
    def __init__(self) -> None:
        self.round = -1
        self.version = -1
        self.expected: dict[str, list[int]] = {}
        self.received: dict[str, Received] = {}
        self.lost: list[int] = []
        self.is_open = False

    def open(self, round_: int, version: int, expected: dict[str, list[int]]) -> None:
        self.round, self.version, self.is_open = round_, version, True
        self.expected = {a: sorted(s) for a, s in expected.items() if s}
        self.received, self.lost = {}, []

    def refusal(self, round_: int, actor: str, slots: list[int]) -> str | None:
        """Why a segment cannot be taken (None: it can)."""
        if not self.is_open or round_ != self.round:
            return f"round {round_} is not the open round ({self.round if self.is_open else 'none'})"
        if actor not in self.expected:
            return f"{actor} owns no slot of round {round_} (or was declared lost)"
        if actor in self.received:
            return f"{actor} already sent its segment of round {round_}"
        if sorted(slots) != self.expected[actor]:
            return f"slots {sorted(slots)} are not {actor}'s slots of round {round_}: {self.expected[actor]}"
        return None

    def receive(self, seg: Received) -> None:
        self.received[seg.actor] = seg

    def lose(self, actor: str) -> list[int]:
        """`actor` is gone: the slots it had not sent in the open round are lost (returned)."""
        if not self.is_open or actor not in self.expected or actor in self.received:
            return []
        lost = self.expected.pop(actor)
        self.lost += lost
        return lost

    @property
    def complete(self) -> bool:
        return self.is_open and all(a in self.received for a in self.expected)

    def take(self) -> RoundBatch:
        """Close the complete round and hand it over (segments in actor-name order)."""
        assert self.complete
        self.is_open = False
        segs = [self.received[a] for a in sorted(self.received)]
        return RoundBatch(self.round, self.version, segs, sorted(self.lost))
