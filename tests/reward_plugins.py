"""Reward functions the reward tests load by `module:function` (as a user's plugin module would be)."""

from __future__ import annotations

import asyncio

from prl_actors.rewards import RewardInput

SLEEP_S = 0.3
calls: list[str] = []


def half(record: RewardInput) -> float:
    return 0.5


def longer(record: RewardInput) -> float:
    return float(len(record.completion))


def difficulty(record: RewardInput) -> float:
    """Reads an extra column of the dataset row."""
    return float(record.row["difficulty"])


async def slow(record: RewardInput) -> float:
    await asyncio.sleep(SLEEP_S)
    return 1.0


def ranks(records: list[RewardInput]) -> list[float]:
    """Batched: the rank of each completion's length within its group (0 = shortest)."""
    order = sorted(range(len(records)), key=lambda i: (len(records[i].completion), i))
    out = [0.0] * len(records)
    for rank, i in enumerate(order):
        out[i] = float(rank)
    return out


async def async_ranks(records: list[RewardInput]) -> list[float]:
    await asyncio.sleep(0.01)
    return ranks(records)


def wrong_length(records: list[RewardInput]) -> list[float]:
    return [1.0]


def flaky(record: RewardInput) -> float:
    """Raises on 1 sample in 5 (sample index 2 of every 5)."""
    if (record.group_id * 100 + record.sample) % 5 == 2:
        raise ValueError(f"cannot score {record.completion!r}")
    return 1.0


def always_raises(record: RewardInput) -> float:
    raise RuntimeError("the verifier is broken")


def nan_sometimes(record: RewardInput) -> float:
    return float("nan") if record.sample == 1 else 1.0


def legacy_three(prompt: str, response: str, answer: str) -> float:
    return 1.0 if answer in response else 0.0
