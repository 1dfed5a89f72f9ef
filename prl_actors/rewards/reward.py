"""One named, weighted reward and how to call it: per sample or batched, sync or async.

Invariant: `Reward.score(records)` returns, per record in order, a finite float or a RewardError
naming the reward, the prompt, the sample and the value or exception.
"""

from __future__ import annotations

import asyncio
import functools
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
        """One finite float or one RewardError per record, in order: a failing sample never hides
        the others' values (a batched call that raises or answers in the wrong shape fails every
        record of the group; a non-finite value only its own). Per-sample async rewards run
        concurrently."""
        if not records:
            return []
        if not self.batched:
            if not is_async(self.fn):  # no task per sample: a sync function finishes inside its await
                return [await self._one(r) for r in records]
            return list(await asyncio.gather(*(self._one(r) for r in records)))
        try:
            values = self._shaped(await self._call(records, None, records[0]), records)
        except RewardError as exc:
            return [exc] * len(records)
        return [self._checked(v, r) for v, r in zip(values, records, strict=True)]

    async def _one(self, record: RewardInput) -> float | RewardError:
        try:
            return self._checked(await self._call(record, record.sample, record), record)
        except RewardError as exc:
            return exc

    async def _call(self, arg: Any, sample: int | None, first: RewardInput) -> Any:
        """fn(arg), awaited when it returns an awaitable (bounded by timeout_s when set)."""
        at = where(first.group_id, first.item, sample)
        try:
            value = self.fn(arg)
            if inspect.isawaitable(value):
                value = await (asyncio.wait_for(value, self.timeout_s) if self.timeout_s else value)
            return value
        except RewardError:
            raise
        except TimeoutError as exc:
            if not self.timeout_s:
                raise RewardError(f"{self._label()} raised on {at}: TimeoutError: {exc}") from exc
            raise RewardError(f"{self._label()} timed out after {self.timeout_s}s on {at}") from None
        except Exception as exc:  # a plugin may raise anything: it becomes one line that names it
            raise RewardError(f"{self._label()} raised on {at}: {type(exc).__name__}: {exc}") from exc

    def _shaped(self, values: Any, records: Sequence[RewardInput]) -> Sequence[Any]:
        """A batched reward's answer: exactly one value per record."""
        if isinstance(values, list | tuple) and len(values) == len(records):
            return values
        got = f"{len(values)} values" if isinstance(values, list | tuple) else type(values).__name__
        raise RewardError(
            f"{self._label()} (batched) returned {got} for the {len(records)} samples of "
            f"{where(records[0].group_id, records[0].item, None)}: expected a list of {len(records)} floats"
        )

    def _checked(self, value: Any, record: RewardInput) -> float | RewardError:
        """`value` as a finite float (bool: 0/1), or the error that names it."""
        if isinstance(value, bool):
            return float(value)
        try:
            out = float(value)
        except (TypeError, ValueError):
            out = math.nan
        if math.isfinite(out):
            return out
        at = where(record.group_id, record.item, record.sample)
        return RewardError(f"{self._label()} returned {value!r} on {at} (rewards must be finite numbers)")

    def _label(self) -> str:
        return f"reward {self.name!r}" + (f" ({self.source})" if self.source and self.source != self.name else "")


def is_async(fn: Any) -> bool:
    """fn is an `async def` function (or a partial of one, or an object with an async __call__)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    call = type(fn).__call__ if not inspect.isroutine(fn) else None  # a callable object's method
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def legacy(fn: Callable[[str, str, str], Any]) -> RewardCallable:
    """A `reward(prompt, response, answer)` function (task.reward, the tasks' own) as a per-sample
    reward of the record."""

    def call(record: RewardInput) -> Any:
        return fn(record.prompt, record.completion, record.answer)

    return call
