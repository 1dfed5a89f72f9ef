"""Environments the multi-turn end-to-end tests load by name (`task.environment`) in worker processes."""

from __future__ import annotations

import time

from prl_actors.envs_llm.guess import GuessEnv

STEP_S = 0.05


class SlowGuess(GuessEnv):
    """The guess game with a 50 ms tool latency per step (episodes are long enough to be killed mid-way)."""

    def __init__(self) -> None:
        super().__init__(9, 4)

    def step(self, text: str) -> tuple[list[dict[str, str]], float, bool]:
        time.sleep(STEP_S)
        return super().step(text)
