"""Reward plugins: `task.reward = "package.module:function"`.

The function is called as `reward(prompt: str, response: str, answer: str) -> float` for every
sample (response = the decoded text, special tokens removed). It must be importable on every
inference worker (e.g. installed, or on PYTHONPATH).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.plugins import load_callable

if TYPE_CHECKING:
    from prl_actors.tasks.base import RewardFn


def load_reward(spec: str) -> RewardFn:
    """Import `module:function`; any failure is a one-line ConfigError."""
    return load_callable(spec, "task.reward")
