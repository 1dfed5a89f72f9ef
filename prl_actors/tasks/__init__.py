"""Tasks: where prompts come from and how responses are scored.

A task yields the prompts of an epoch as a pure function of (seed, epoch), sampled without
replacement across its items, so a resumed or replayed run sees the same prompts, and scores a
response with a reward function. `load_task` (tasks/registry.py) picks the task of a config.
"""

from __future__ import annotations

from prl_actors.tasks.base import RewardFn, Task
from prl_actors.tasks.registry import load_task

__all__ = ["RewardFn", "Task", "load_task"]
