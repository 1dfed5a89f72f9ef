"""One named, weighted reward and how to call it: per sample or batched, sync or async.

Invariant: `Reward.score(records)` returns, per record in order, a finite float or a RewardError
naming the reward, the prompt, the sample and the value or exception (with the plugin's file:line
and its traceback in `RewardError.trace`).

Deadlines: an async reward's wait is bounded by `timeout_s`. A user plugin's sync function
(`isolated`) runs in a daemon thread of its own (the group's samples one after another, as a plain
call would), and the caller waits for it under the same `timeout_s`: a plugin that hangs costs one
deadline, then its thread is abandoned (a daemon thread does not keep the process alive). Every
wait also ends at once when the process is asked to stop (plugins.STOPPING): `stop` is honoured
whatever a plugin does (RewardStopped, never a made-up value).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import math
import numbers
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prl_actors.plugins import STOPPING
from prl_actors.rewards.errors import RewardError, RewardStopped, origin, trace_of, where

if TYPE_CHECKING:
    from prl_actors.rewards.record import RewardInput

RewardCallable = Callable[..., Any]
"""fn(record) -> float | Awaitable[float]; batched: fn(records) -> list[float] | Awaitable[list[float]]."""
POLL_S = 0.05  # how often a reward's wait looks at plugins.STOPPING
MAX_SHOWN = 300  # characters of a bad value or an exception's message in the error line


@dataclass
class Reward:
    """A reward function with its name (the metrics key `reward/<name>`), weight and calling style.

    `source` says where it came from (`module:function`, `builtin math`, `model DIR`, `url ...`)
    for error lines. `timeout_s` bounds an async reward's wait, and an isolated one's (None: no
    bound of its own). `isolated`: a user's plugin, whose sync calls run in a thread of their own
    under that deadline (module docstring)."""

    name: str
    fn: RewardCallable
    weight: float = 1.0
    batched: bool = False
    source: str = ""
    timeout_s: float | None = None
    isolated: bool = False

    async def score(self, records: Sequence[RewardInput]) -> list[float | RewardError]:
        """One finite float or one RewardError per record, in order: a failing sample never hides
        the others' values (a batched call that raises or answers in the wrong shape fails every
        record of the group; a bad value only its own). Per-sample async rewards run concurrently."""
        if not records:
            return []
        if not self.batched:
            if self.isolated and not is_async(self.fn):
                return await self._each_in_thread(records)
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
            if self.isolated and not is_async(self.fn):
                value = await self._in_thread(functools.partial(self.fn, arg), at)
            else:
                value = self.fn(arg)
            if inspect.isawaitable(value):
                value = await self._wait(value, at)
            return value
        except RewardError:
            raise
        except Exception as exc:  # a plugin may raise anything: it becomes one line that names it
            raise self._raised(exc, at) from exc

    async def _each_in_thread(self, records: Sequence[RewardInput]) -> list[float | RewardError]:
        """A sync per-sample plugin: the group's calls in one thread, in order, under one deadline."""

        def run() -> list[Any]:
            out: list[Any] = []
            for r in records:
                try:
                    out.append(self.fn(r))
                except Exception as exc:  # noqa: BLE001 - reported per sample below
                    out.append(_Raised(exc))
            return out

        try:
            values = await self._in_thread(run, where(records[0].group_id, records[0].item, None))
        except RewardError as exc:
            return [exc] * len(records)
        return [
            self._raised(v.exc, where(r.group_id, r.item, r.sample)) if isinstance(v, _Raised) else self._checked(v, r)
            for v, r in zip(values, records, strict=True)
        ]

    async def _in_thread(self, call: Callable[[], Any], at: str) -> Any:
        """call() in a daemon thread, awaited under the deadline and plugins.STOPPING."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()

        def target() -> None:
            try:
                result: tuple[bool, Any] = (True, call())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                result = (False, exc)
            with contextlib.suppress(RuntimeError):  # the caller's loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(_settle, done, result)

        threading.Thread(target=target, name=f"reward-{self.name}", daemon=True).start()
        ok, value = await self._wait(done, at)
        if not ok:  # a SystemExit or KeyboardInterrupt of the plugin's is its error too, never the worker's exit
            raise value if isinstance(value, Exception) else self._raised(value, at)
        return value

    async def _wait(self, future: Awaitable[Any], at: str) -> Any:
        """The future's result, or a RewardError at the deadline / RewardStopped on a stop."""
        task = asyncio.ensure_future(future)
        deadline = time.monotonic() + self.timeout_s if self.timeout_s else math.inf
        while not task.done():
            if STOPPING.is_set():
                task.cancel()
                raise RewardStopped(f"{self._label()} was abandoned on {at}: this process is stopping")
            left = deadline - time.monotonic()
            if left <= 0:
                task.cancel()
                raise RewardError(f"{self._label()} timed out after {self.timeout_s}s on {at}")
            await asyncio.wait({task}, timeout=min(POLL_S, left))
        return task.result()

    def _raised(self, exc: BaseException, at: str) -> RewardError:
        """The one line for a plugin's exception (with its file:line), its traceback kept."""
        place = origin(exc)
        line = f"{self._label()} raised on {at}: {type(exc).__name__}: {_short(_text(exc))}"
        return RewardError(line + (f" ({place})" if place else ""), trace_of(exc))

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
        """`value` as a finite float, or the error that names it. A reward is a real number: bool
        (0/1), int, float (numpy's too, and a 0-d array or tensor); never a string such as "1.0"."""
        number = real(value)
        if number is not None and math.isfinite(number):
            return number
        at = where(record.group_id, record.item, record.sample)
        if number is not None:
            return RewardError(f"{self._label()} returned {value!r} on {at} (rewards must be finite numbers)")
        return RewardError(
            f"{self._label()} returned {_short(repr(value))} of type {type(value).__name__} on {at} "
            "(rewards must be real numbers: bool, int or float)"
        )

    def _label(self) -> str:
        return f"reward {self.name!r}" + (f" ({self.source})" if self.source and self.source != self.name else "")


@dataclass
class _Raised:
    exc: Exception


def _settle(future: asyncio.Future[Any], result: tuple[bool, Any]) -> None:
    if not future.done():
        future.set_result(result)


def real(value: Any) -> float | None:
    """`value` as a float when it is a real number (bool, int, float, numpy's, a 0-d array or
    tensor), else None (strings, None, containers, complex numbers ...)."""
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        value = value.item()
    if isinstance(value, numbers.Real):
        return float(value)
    return None


def _short(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - an exception whose str() raises still has a type
        return "(unprintable)"


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
