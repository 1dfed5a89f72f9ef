"""`task.rewards` (config) -> a RewardSet; the task's own reward when the list is empty.

Every mistake a config can make here is a one-line ConfigError at load time (an unknown builtin, a
module that does not import, a missing model directory): `up` finds it before any actor starts.
Reward models load lazily, on first use, so the coordinator never loads one.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prl_actors.plugins import load_callable
from prl_actors.rewards.builtins import BUILTINS
from prl_actors.rewards.combine import RewardSet
from prl_actors.rewards.reward import Reward
from prl_actors.sections import ConfigError

if TYPE_CHECKING:
    from prl_actors.tasks.config import RewardSpec, TaskSection

PLUGIN_TIMEOUT_S = 300.0  # a plugin's (or an async fn reward's) default bound for one group: no wait without a deadline


def configure(t: TaskSection, own: RewardSet) -> RewardSet:
    """The run's rewards: `task.rewards` when given (each reported as `reward/<name>`), else the
    task's own (`own`), both under `task.on_reward_error`."""
    if not t.rewards:
        own.on_error = t.on_reward_error
        return own
    return RewardSet([build(spec, i) for i, spec in enumerate(t.rewards)], t.on_reward_error, report_parts=True)


def build(spec: RewardSpec, i: int) -> Reward:
    name = spec.default_name()
    if spec.model:
        from prl_actors.rewards.model import ModelReward

        return Reward(name, ModelReward.from_spec(spec, f"task.rewards[{i}]"), spec.weight, True, f"model {spec.model}")
    if spec.url:
        from prl_actors.rewards.http import HttpReward

        return Reward(name, HttpReward.from_spec(spec), spec.weight, True, f"url {spec.url}")
    assert spec.fn is not None
    fn = load_function(spec.fn, f"task.rewards[{i}].fn")
    fn = _bind(fn, spec.args, f"task.rewards[{i}]")
    plugin = spec.fn not in BUILTINS  # a user's function: its sync calls run under the deadline too
    source = spec.fn if plugin else f"builtin {spec.fn}"
    return Reward(name, fn, spec.weight, spec.batched, source, spec.timeout_s or PLUGIN_TIMEOUT_S, isolated=plugin)


def load_function(spec: str, option: str) -> Callable[..., Any]:
    """A builtin name or `module:function`; any failure is a one-line ConfigError naming `option`."""
    if spec in BUILTINS:
        return BUILTINS[spec]
    return load_callable(spec, option, f"a builtin ({', '.join(BUILTINS)}) or 'module:function'")


def _bind(fn: Callable[..., Any], args: dict[str, Any], option: str) -> Callable[..., Any]:
    """fn with `args` bound as keywords (checked against its signature now, not at the first sample)."""
    if not args:
        return fn
    try:
        inspect.signature(fn).bind_partial(None, **args)
    except TypeError as exc:
        raise ConfigError(f"{option}.args {args}: {exc}") from None
    except ValueError:
        pass  # no signature to check (a builtin of C)
    return functools.partial(fn, **args)  # an async fn's partial returns a coroutine: awaited alike
