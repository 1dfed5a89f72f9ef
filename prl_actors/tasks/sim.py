"""The task of the simulated engine: a contextual bandit (control-plane tests and benchmarks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.tasks.base import Task, exact_match

if TYPE_CHECKING:
    from prl_actors.config import Config


def sim_task(cfg: Config) -> Task:
    """Context k's correct arm is (3k+1) mod arms."""
    arms = cfg.sim.arms
    items = [(f"ctx {k}", str((3 * k + 1) % arms)) for k in range(arms)]
    return Task(items=items, reward=exact_match, seed=cfg.run.seed, name="sim")
