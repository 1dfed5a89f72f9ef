"""The Task interface and the task registry."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from prl_actors.config import Config, ConfigError
from prl_actors.protocol.messages import Prompt

RewardFn = Callable[[str, str, str], float]
"""reward(prompt, response, answer) -> float. See docs/TASKS.md."""


def exact_match(prompt: str, response: str, answer: str) -> float:
    return 1.0 if response.strip() == answer.strip() else 0.0


@dataclass
class Task:
    """A fixed list of (prompt, answer) pairs sampled per epoch, plus a reward function."""

    items: list[tuple[str, str]]
    reward: RewardFn
    seed: int = 0

    def prompts_for_epoch(self, epoch: int, n: int) -> list[Prompt]:
        """The epoch's n prompts; group ids are 0..n-1. Deterministic in (seed, epoch)."""
        rng = random.Random(self.seed * 1_000_003 + epoch)
        picks = [self.items[rng.randrange(len(self.items))] for _ in range(n)]
        return [Prompt(group_id=i, prompt=p, answer=a) for i, (p, a) in enumerate(picks)]

    def score(self, prompt: Prompt, response: str) -> float:
        return float(self.reward(prompt.prompt, response, prompt.answer))


def sim_task(cfg: Config) -> Task:
    """Contextual bandit for the simulated engine: context k's correct arm is (3k+1) mod arms."""
    arms = cfg.sim.arms
    items = [(f"ctx {k}", str((3 * k + 1) % arms)) for k in range(arms)]
    return Task(items=items, reward=exact_match, seed=cfg.run.seed)


TASK_NAMES = ("add", "jsonl")


def load_task(cfg: Config) -> Task:
    """The run's task: the sim bandit for the sim engine, else `task.name` ("add" or "jsonl"),
    with its reward replaced by the `task.reward` plugin when one is set. See docs/TASKS.md."""
    if cfg.worker.engine == "sim":
        return sim_task(cfg)
    if cfg.task.name == "add":
        from prl_actors.tasks.arith import add_task

        task = add_task(cfg)
    elif cfg.task.name == "jsonl":
        from prl_actors.tasks.jsonl import jsonl_task

        task = jsonl_task(cfg)
    else:
        raise ConfigError(f"unknown task {cfg.task.name!r}: use one of {', '.join(TASK_NAMES)}")
    if cfg.task.reward:
        from prl_actors.tasks.plugins import load_reward

        task.reward = load_reward(cfg.task.reward)
    return task
