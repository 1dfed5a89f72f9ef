"""One named, weighted reward and how to call it: per sample or batched, sync or async.

Invariant: `Reward.score(records)` returns, per record in order, a finite float or a RewardError
naming the reward, the prompt, the sample and the value or exception.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prl_actors.rewards.errors import RewardError, where
from prl_actors.rewards.record import RewardInput

RewardCallable = Callable[..., Any]
"""fn(record) -> float | Awaitable[float]; batched: fn(records) -> list[float] | Awaitable[list[float]]."""


@dataclass
class Reward:
    """A reward function with its name (the metrics key `reward/<name>`), weight and calling style.

    `source` says where it came from (`module:function`, `builtin math`, `model DIR`, `url ...`)
    for error lines. `timeout_s` bounds an async reward's wait (None: no bound of its own)."""

    name: str
    fn: RewardCallable
    weight: float = 1.0
    batched: bool = False
    source: str = ""
    timeout_s: float | None = None

    async def score(self, records: Sequence[RewardInput]) -> list[float | RewardError]:
        """One finite float or one RewardError per record, in order (a failing sample never hides
        the others' values; a failing batched call fails every record of the group). Per-sample
        async rewards run concurrently."""
        if self.batched:
            try:
                values = await self._call(self.fn, records, None, records)
                return list(self._check_batch(values, records))
            except RewardError as exc:
                return [exc] * len(records)
        return list(await asyncio.gather(*(self._one(r) for r in records)))

    async def _one(self, record: RewardInput) -> float | RewardError:
        try:
            return self._finite(await self._call(self.fn, record, record.sample, [record]), record, record.sample)
        except RewardError as exc:
            return exc

    async def _call(self, fn: RewardCallable, arg: Any, sample: int | None, records: Sequence[RewardInput]) -> Any:
        first = records[0]
        try:
            value = fn(arg)
            if inspect.isawaitable(value):
                value = await asyncio.wait_for(value, self.timeout_s) if self.timeout_s else await value
            return value
        except RewardError:
            raise
        except TimeoutError:
            raise RewardError(
                f"{self._label()} timed out after {self.timeout_s}s on {where(first.group_id, first.item, sample)}"
            ) from None
        except Exception as exc:  # a plugin may raise anything: it becomes one line that names it
            raise RewardError(
                f"{self._label()} raised on {where(first.group_id, first.item, sample)}: {type(exc).__name__}: {exc}"
            ) from exc

    def _check_batch(self, values: Any, records: Sequence[RewardInput]) -> list[float]:
        first = records[0]
        if not isinstance(values, list | tuple) or len(values) != len(records):
            got = f"{len(values)} values" if isinstance(values, list | tuple) else type(values).__name__
            raise RewardError(
                f"{self._label()} (batched) returned {got} for the {len(records)} samples of "
                f"{where(first.group_id, first.item, None)}: expected a list of {len(records)} floats"
            )
        return [self._finite(v, r, r.sample) for v, r in zip(values, records, strict=True)]

    def _finite(self, value: Any, record: RewardInput, sample: int) -> float:
        if isinstance(value, bool):
            return float(value)
        try:
            out = float(value)
        except (TypeError, ValueError):
            out = math.nan
        if not math.isfinite(out):
            raise RewardError(
                f"{self._label()} returned {value!r} on {where(record.group_id, record.item, sample)} "
                "(rewards must be finite numbers)"
            )
        return out

    def _label(self) -> str:
        return f"reward {self.name!r}" + (f" ({self.source})" if self.source and self.source != self.name else "")


def legacy(fn: Callable[[str, str, str], Any]) -> RewardCallable:
    """A `reward(prompt, response, answer)` function (task.reward, the tasks' own) as a per-sample
    reward of the record."""

    def call(record: RewardInput) -> Any:
        return fn(record.prompt, record.completion, record.answer)

    return call
