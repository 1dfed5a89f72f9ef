"""How the trainer and a local worker hand the cores of one host to each other (`threads: auto`).

Strict on-policy makes the epoch's phases strict too: the worker generates v_e's groups, the trainer
trains them as they arrive, and the worker then waits for v_{e+1}. So neither needs its share of the
cores all the time:

    epoch opens          worker: every core (the trainer has nothing to train yet)
    first group sent     worker: its share (the trainer starts training)
    last group arrives   trainer: every core (the worker waits for the next weights)
    next epoch opens     trainer: its share again

Each side changes only its own torch thread count, between its own units of work (a decode step, a
training slice), so the hand-over is as quick as those units are short: a worker's step is a few
milliseconds, and the trainer cuts its flushes into slices while a hand-over is to come
(actors/scheduling.py's SLICE_S). OpenMP threads that are not running cost nothing; two sides both at
every core would oversubscribe, which the order above never does with one local worker.

This module is the mechanism (a thread count per side); when the trainer switches, and how it paces
its flushes meanwhile, is the scheduling policy of actors/scheduling.py. The numbers (`share`,
`full`) come from the one thread policy, prl_actors/threads.py.
"""

from __future__ import annotations

from collections.abc import Callable


class ThreadPlan:
    """One actor's torch threads: `share` while the other side works, `full` (every core) while it
    waits. `apply` sets the thread count (torch.set_num_threads in a run)."""

    def __init__(self, share: int, full: int, apply: Callable[[int], None]) -> None:
        self.share, self.full, self.apply = share, full, apply
        self.current = 0

    def take_share(self) -> None:
        self._set(self.share)

    def take_all(self) -> None:
        self._set(self.full)

    @property
    def boost_pending(self) -> bool:
        """On the share now, with every core still to come."""
        return self.current == self.share < self.full

    def _set(self, n: int) -> None:
        if n != self.current:
            self.apply(n)
            self.current = n
