"""The torch thread policy: how many threads each process of a run gives torch (one module).

    actor process (`up`, one host)   trainer: half the cores, the local workers share the rest (>= 1 each)
    actor started on its own         every core
    a trainer rank (world_size N)    the host's cores / N (>= 1)
    an env process / learner         env.threads
    a number in the config           that number, always

`auto` never oversubscribes beyond the one-thread-per-process floor. The hand-over between a trainer
and its one local worker (every core while the other side waits) is ThreadPlan below,
which takes its `share` and `full` from `threads_for` and is switched by trainer/scheduling.py's
policy. This module imports nothing of prl_actors at run time (a leaf: every layer may use it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prl_actors.classic.envkit.settings import EnvSection
    from prl_actors.trainer.config import TrainerSection
    from prl_actors.worker.config import WorkerSection

LOCAL_WORKERS_ENV = "PRL_LOCAL_WORKERS"  # set by `up` for the actors it starts on this host
THREADED_ROLES = ("worker", "trainer")  # the roles that run torch (an actor process limits only these)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, not the host's count)."""
    return len(os.sched_getaffinity(0))


def local_workers() -> int | None:
    """How many workers `up` starts on this host (LOCAL_WORKERS_ENV), or None for an actor started
    on its own."""
    local = os.environ.get(LOCAL_WORKERS_ENV, "")
    return int(local) if local.isdigit() else None


def threads_for(
    worker: WorkerSection, trainer: TrainerSection, role: str, local_workers: int | None, cores: int | None = None
) -> int:
    """The torch threads of `role`: the configured number (worker.threads or trainer.threads), or
    `auto`: with `up` on this host the trainer takes half the cores and the local workers share the
    rest (at least 1 each); an actor started on its own (local_workers None) takes every core."""
    setting = worker.threads if role == "worker" else trainer.threads
    if setting != "auto":
        return int(setting)
    cores = cores or usable_cores()
    if local_workers is None:
        return cores
    half = max(1, cores // 2) if local_workers else cores
    return half if role == "trainer" else max(1, (cores - half) // max(1, local_workers))


def rank_threads(trainer: TrainerSection, cores: int | None = None) -> int:
    """A trainer rank's torch threads: trainer.threads, or auto: the host's cores split across the
    ranks (at least 1 each)."""
    setting = trainer.threads
    if setting != "auto":
        return int(setting)
    return max(1, (cores or usable_cores()) // trainer.world_size)


def env_threads(env: EnvSection | None) -> int:
    """An env actor's or the learner's torch threads (classic RL): env.threads."""
    assert env is not None
    return env.threads


def set_torch_threads(n: int) -> None:
    """Give torch `n` intra-op threads (imports torch only here)."""
    import torch

    torch.set_num_threads(n)


def limit_actor_threads(role: str, worker: WorkerSection, trainer: TrainerSection) -> None:
    """One process per actor: give torch the configured threads, not every core (oversubscription).
    Only the torch roles, and not with the `sim` engine (no torch work)."""
    if worker.engine == "sim" or role not in THREADED_ROLES:
        return
    set_torch_threads(threads_for(worker, trainer, role, local_workers()))


# --- the hand-over between a trainer and its one local worker -------------------------------------
# How the trainer and a local worker hand the cores of one host to each other (`threads: auto`).
#
# Strict on-policy makes the epoch's phases strict too: the worker generates v_e's groups, the trainer
# trains them as they arrive, and the worker then waits for v_{e+1}. So neither needs its share of the
# cores all the time:
#
#     epoch opens          worker: every core (the trainer has nothing to train yet)
#     first group sent     worker: its share (the trainer starts training)
#     last group arrives   trainer: every core (the worker waits for the next weights)
#     next epoch opens     trainer: its share again
#
# Each side changes only its own torch thread count, between its own units of work (a decode step, a
# training slice), so the hand-over is as quick as those units are short: a worker's step is a few
# milliseconds, and the trainer cuts its flushes into slices while a hand-over is to come
# (trainer/scheduling.py's SLICE_S). OpenMP threads that are not running cost nothing; two sides both at
# every core would oversubscribe, which the order above never does with one local worker.
#
# This module is the mechanism (a thread count per side); when the trainer switches, and how it paces
# its flushes meanwhile, is the scheduling policy of trainer/scheduling.py. The numbers (`share`,
# `full`) come from the one thread policy (threads_for, above).


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
