"""Reward failures: one line that names the reward, the prompt and the value or exception."""

from __future__ import annotations


class RewardError(Exception):
    """A reward raised, returned a non-finite number, or answered in the wrong shape.

    str(exc) is the whole story in one line, e.g.
    `reward 'acc' (my_rewards:accuracy) raised on prompt 3 (row 17) sample 2: ValueError: boom`."""


def where(group_id: int, item: int, sample: int | None) -> str:
    """`prompt 3 (row 17) sample 2`: the prompt's group id, its data row, the sample (None: the group)."""
    text = f"prompt {group_id}" + (f" (row {item})" if item >= 0 else "")
    return text if sample is None else f"{text} sample {sample}"
