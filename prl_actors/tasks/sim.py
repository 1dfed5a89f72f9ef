"""The task of the simulated engine: a contextual bandit (control-plane tests and benchmarks)."""

from __future__ import annotations

from prl_actors.tasks.base import Task, exact_match


def sim_task(arms: int, seed: int) -> Task:
    """Context k's correct arm is (3k+1) mod arms (`arms`: sim.arms)."""
    items = [(f"ctx {k}", str((3 * k + 1) % arms)) for k in range(arms)]
    return Task(items=items, reward=exact_match, seed=seed, name="sim")
