"""Which env actor owns each of the run's N env slots: the learner's pure slot table.

Invariants:
- a slot has at most one owner; `owned(actor)` is sorted; an actor's slots are exactly those whose
  owner is it;
- a slot whose owner was lost is an orphan until `place` gives it to a live actor (the least loaded,
  ties by name), where it starts a new episode: it is never stepped on two actors, never dropped;
- moving a slot off a live actor happens only on purpose (`rebalance`, at an episode boundary or a
  round boundary), so join/leave never cuts an episode silently;
- seeds: a slot reset with seed s and placed anew for the k-th time is reset with s + k * N (the
  seeds of the vector env stay distinct and the run reproducible); an unseeded slot stays unseeded (-1).
"""

from __future__ import annotations

from collections.abc import Iterable

UNSEEDED = -1


class SlotTable:
    def __init__(self, n: int) -> None:
        self.n = n
        self.owner: list[str | None] = [None] * n
        self.seed: list[int] = [UNSEEDED] * n  # the seed of the slot's last seeded reset
        self.moves: list[int] = [0] * n  # how often the slot was placed anew since that reset

    def owned(self, actor: str) -> list[int]:
        return [s for s in range(self.n) if self.owner[s] == actor]

    def by_owner(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for s, actor in enumerate(self.owner):
            if actor is not None:
                out.setdefault(actor, []).append(s)
        return out

    def orphans(self) -> list[int]:
        return [s for s in range(self.n) if self.owner[s] is None]

    def assign_all(self, actors: Iterable[str], seeds: list[int]) -> dict[str, list[int]]:
        """Every slot anew, in contiguous balanced blocks over `actors` (sorted): actor -> slots."""
        names = sorted(actors)
        self.seed, self.moves = list(seeds), [0] * self.n
        for s in range(self.n):
            self.owner[s] = names[s * len(names) // self.n] if names else None
        return {a: self.owned(a) for a in names}

    def drop(self, actor: str) -> list[int]:
        """The actor is gone: its slots become orphans (returned)."""
        lost = self.owned(actor)
        for s in lost:
            self.owner[s] = None
        return lost

    def place(self, live: Iterable[str]) -> dict[str, list[int]]:
        """Give every orphan to the least-loaded live actor: actor -> newly placed slots."""
        names = sorted(live)
        placed: dict[str, list[int]] = {}
        if not names:
            return placed
        for s in self.orphans():
            target = min(names, key=lambda a: (len(self.owned(a)), a))
            self._move(s, target)
            placed.setdefault(target, []).append(s)
        return placed

    def rebalance(self, slot: int, live: Iterable[str]) -> str | None:
        """Move `slot` (at an episode boundary) to the least-loaded live actor if its owner has at least
        two slots more; returns the new owner, or None when it stays."""
        owner = self.owner[slot]
        names = sorted(live)
        if owner is None or not names:
            return None
        target = min(names, key=lambda a: (len(self.owned(a)), a))
        if len(self.owned(owner)) < len(self.owned(target)) + 2:
            return None
        self._move(slot, target)
        return target

    def reset_seed(self, slot: int) -> int:
        """The seed the slot's next reset on a new owner uses (see the module docstring)."""
        s = self.seed[slot]
        return UNSEEDED if s == UNSEEDED else s + self.moves[slot] * self.n

    def _move(self, slot: int, actor: str) -> None:
        self.owner[slot] = actor
        self.moves[slot] += 1
