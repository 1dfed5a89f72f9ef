"""The environment API of multi-turn episodes (docs/TASKS.md, "Writing an environment").

An environment plays one episode against the model:

    reset(row) -> messages                        the conversation before the model's first turn
    step(assistant_turn_text) -> (observation messages, reward, done)

`row` is the dataset row (a Prompt: `prompt`, `answer`, `group_id`). Messages are chat messages,
`{"role": ..., "content": ...}`. Either method may be `async def`. The episode's reward is the sum
of its steps' rewards; it ends when a step says `done`, or after `task.max_turns` model turns
(then `finished` is False, like a single-turn sample cut at `max_new_tokens`).

Invariants the engine relies on (checked where it can):
* one environment object per episode (the factory is called G times per group);
* `reset` of the same row gives the same messages in every episode of a group (the G episodes share
  the initial prompt, in generation and in the trainer's shared-prompt packing);
* the environment's behaviour depends only on the row and on the model's turns, never on timing, so
  a requeued episode regenerated with the same weights replays the same way.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from prl_actors.rewards.reward import real

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Prompt

Message = dict[str, Any]
"""A chat message: {"role": "user" | "assistant" | "tool" | "system", "content": str, ...}."""


@dataclass
class StepResult:
    """What `Environment.step` returns (a plain 3-tuple is accepted too)."""

    observation: list[Message]
    reward: float
    done: bool


class Environment(Protocol):
    def reset(self, row: Prompt) -> list[Message] | Any:
        """The messages before the model's first turn (may be a coroutine)."""
        ...

    def step(self, text: str) -> tuple[list[Message], float, bool] | StepResult | Any:
        """React to the model's turn: observation messages, the step's reward, and whether it is over."""
        ...


EnvFactory = Callable[[], Environment]


class EnvError(RuntimeError):
    """An environment broke its contract or raised: the worker hands its groups back and says why."""


def resolve(value: Any) -> Any:
    """The value of a sync call, or of an `async def` call run to completion on a private loop (the
    caller is a pool thread or the worker thread, never inside a running loop)."""
    if inspect.isawaitable(value):
        return asyncio.run(_await(value))
    return value


async def _await(value: Any) -> Any:
    return await value


def reset_messages(env: Environment, row: Prompt) -> list[Message]:
    messages = resolve(env.reset(row))
    return check_messages(messages, "reset")


def step_result(env: Environment, text: str) -> StepResult:
    """`env.step(text)`, resolved and checked (an EnvError names what is wrong)."""
    try:
        out = resolve(env.step(text))
    except BaseException as exc:  # noqa: BLE001 - a SystemExit of the environment's is its error, not the worker's exit
        raise EnvError(f"environment step raised {type(exc).__name__}: {exc}") from exc
    if isinstance(out, StepResult):
        result = out
    elif isinstance(out, tuple) and len(out) == 3:
        result = StepResult(list(out[0] or []), out[1], out[2])
    else:
        raise EnvError(f"environment step must return (messages, reward, done), got {type(out).__name__}")
    check_messages(result.observation, "step")
    reward = real(result.reward)
    if reward is None:
        shown = repr(result.reward)[:60]
        raise EnvError(
            f"environment step reward must be a real number (bool, int or float), got {shown} "
            f"of type {type(result.reward).__name__}"
        )
    if not math.isfinite(reward):
        raise EnvError(f"environment step reward must be finite, got {reward}")
    return StepResult(result.observation, reward, bool(result.done))


def check_messages(messages: Any, where: str) -> list[Message]:
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("content", ""), str) and isinstance(m.get("role"), str)
        for m in messages
    ):
        raise EnvError(f"environment {where} must return a list of {{'role': str, 'content': str}} messages")
    return messages
