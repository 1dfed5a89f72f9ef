"""Reward plugins: `task.reward = "package.module:function"`.

The function is called as `reward(prompt: str, response: str, answer: str) -> float` for every
sample (response = the decoded text, special tokens removed). It must be importable on every
inference worker (e.g. installed, or on PYTHONPATH).
"""

from __future__ import annotations

import importlib

from prl_actors.config import ConfigError
from prl_actors.tasks.base import RewardFn


def load_reward(spec: str) -> RewardFn:
    """Import `module:function`; any failure is a one-line ConfigError."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"task.reward {spec!r} must look like 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"task.reward {spec!r}: cannot import module {module_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise ConfigError(f"task.reward {spec!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ConfigError(f"task.reward {spec!r}: {attr!r} is not callable")
    return fn
