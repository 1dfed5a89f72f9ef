"""Reward plugins that misbehave, loaded by name (`task.reward`, `task.rewards[].fn`) in worker
processes by tests/test_reward_guards.py."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from prl_actors.rewards.record import RewardInput

RELEASE = threading.Event()  # set by an in-process test to let the hanging plugins return
HANG_DIR_ENV = "PRL_TEST_HANG_DIR"


def hangs(prompt: str, response: str, answer: str) -> float:
    """A sync task.reward that never returns (until RELEASE, in-process); with HANG_DIR_ENV set, it
    first leaves a file there named by its process id, so a test knows the worker is inside it."""
    where = os.environ.get(HANG_DIR_ENV)
    if where:
        (Path(where) / f"in-plugin-{os.getpid()}").touch()
    RELEASE.wait()
    return 1.0


def hangs_record(record: RewardInput) -> float:
    RELEASE.wait()
    return 1.0


def as_text(record: RewardInput) -> object:
    return "1.0"


def divides(prompt: str, response: str, answer: str) -> float:
    """A task.reward with a bug: it raises ZeroDivisionError on the next line."""
    zero = len(answer) * 0
    return len(response) / zero


def slow(record: RewardInput) -> float:
    time.sleep(0.05)
    return 0.5


class HangingEnv:
    """A multi-turn environment whose step never returns (until RELEASE, in-process)."""

    def reset(self, row: object) -> list[dict[str, str]]:
        return [{"role": "user", "content": getattr(row, "prompt", "")}]

    def step(self, text: str) -> tuple[list[dict[str, str]], float, bool]:
        RELEASE.wait()
        return [], 0.0, True
