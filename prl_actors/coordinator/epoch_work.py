"""The work of one epoch: which groups are queued, held by a worker, or done (exactly-once rules).

Invariants (each group id 0..B-1 of the epoch is in exactly one of these at any time):
- queued: in `queue`, not held, not done;
- held: `holder[g]` is the one worker it was handed to, not queued, not done;
- done: accepted by the buffer; never queued or handed out again, whoever reports it.
A worker that leaves or goes silent releases what it holds: those groups go back to the front of the
queue (oldest work first) and are regenerated with the same weights. Workers told `queue_empty`
wait in `waiting` until work returns (then the coordinator nudges them).
"""

from __future__ import annotations

from collections import deque
from enum import Enum


class Accept(Enum):
    """What accepting a group changed."""

    NEW = "new"  # it was queued or held: now done
    ALREADY = "already"  # it was done before (a duplicate report)


class EpochWork:
    def __init__(self, group_ids: list[int]) -> None:
        self.total = len(group_ids)
        self.queue: deque[int] = deque(sorted(group_ids))
        self.holder: dict[int, str] = {}  # group id -> the worker holding it
        self.done: set[int] = set()
        self.waiting: set[str] = set()  # workers told queue_empty, to nudge when work returns

    @classmethod
    def empty(cls) -> EpochWork:
        return cls([])

    @property
    def complete(self) -> bool:
        return self.total > 0 and len(self.done) == self.total

    def held_by(self, worker: str) -> list[int]:
        return sorted(g for g, w in self.holder.items() if w == worker)

    def fair_share(self, worker: str, workers: int) -> int:
        """How many more groups `worker` may take now: an equal share (rounded up) of the work not yet
        done among the `workers` registered, less what it holds. A lone worker takes everything; with
        several, a fast worker cannot take a slower or later one's share, yet never waits on it: each
        group it finishes frees share again, and one holding nothing always gets work if any is queued."""
        undone = len(self.queue) + len(self.holder)
        return min(len(self.queue), max(0, -(-undone // max(1, workers)) - len(self.held_by(worker))))

    def assign(self, worker: str, n: int) -> list[int]:
        """Hand the first `n` queued groups to `worker` (fewer if fewer are queued)."""
        groups = [self.queue.popleft() for _ in range(min(n, len(self.queue)))]
        for g in groups:
            self.holder[g] = worker
        self.waiting.discard(worker)
        return groups

    def accept(self, group_id: int) -> tuple[Accept, str | None]:
        """Mark a group done; returns what changed and who held it (None: nobody)."""
        if group_id in self.done:
            return Accept.ALREADY, None
        self.done.add(group_id)
        holder = self.holder.pop(group_id, None)
        # accepted from a worker we had given up on: keep it done. A held group is never queued, so
        # the O(B) deque scan is needed only when nobody held it (it was requeued).
        if holder is None and group_id in self.queue:
            self.queue.remove(group_id)
        return Accept.NEW, holder

    def release(self, worker: str) -> list[int]:
        """Requeue everything `worker` holds (it left or went silent); returns those groups."""
        lost = self.held_by(worker)
        for g in lost:
            del self.holder[g]
        self.queue.extendleft(reversed(lost))  # back at the front: oldest work first
        self.waiting.discard(worker)
        return lost

    def give_back(self, group_id: int) -> bool:
        """Requeue one group (at the front) that its holder gave back or that was refused, even after
        it was done (the trainer refused it); False when it was neither held nor done."""
        if self.holder.pop(group_id, None) is None:
            if group_id not in self.done:
                return False
            self.done.discard(group_id)
        self.queue.appendleft(group_id)
        return True

    def drop(self, group_id: int) -> None:
        """Give up on a group (task.on_error skip): done without being trained, never handed out again."""
        self.holder.pop(group_id, None)
        if group_id in self.queue:
            self.queue.remove(group_id)
        self.done.add(group_id)

    def overdue(self, now: float, since: dict[int, float], deadline_s: float) -> dict[str, list[int]]:
        """worker -> the groups it has held longer than `deadline_s` (`since`: when each was assigned)."""
        out: dict[str, list[int]] = {}
        for g, w in sorted(self.holder.items()):
            if now - since.get(g, now) > deadline_s:
                out.setdefault(w, []).append(g)
        return out

    def extend(self, group_ids: list[int]) -> None:
        """Add new groups (dynamic sampling's next round) at the back of the queue."""
        self.total += len(group_ids)
        self.queue.extend(sorted(group_ids))

    def take_waiting(self) -> list[str]:
        """The workers to nudge now that work is queued again (and forget them)."""
        names, self.waiting = sorted(self.waiting), set()
        return names
