"""Reward shaping the worker adds to a task's reward: DAPO's soft overlong penalty.

For a response of L tokens with max_new_tokens Lmax and buffer Lb (task.overlong_buffer > 0):

    penalty(L) = 0                                         if L <= Lmax - Lb
               = -(L - (Lmax - Lb)) / Lb * overlong_penalty  otherwise, capped at -overlong_penalty

It depends only on the response's token count, so it is the same on every worker and in every mode.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Overlong:
    max_new_tokens: int
    buffer: int  # 0 = off
    penalty: float

    def __call__(self, length: int) -> float:
        """The (non-positive) reward added to a response of `length` tokens."""
        if self.buffer <= 0:
            return 0.0
        over = length - (self.max_new_tokens - self.buffer)
        if over <= 0:
            return 0.0
        return -min(over / self.buffer, 1.0) * self.penalty
