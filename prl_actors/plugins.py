"""User plugins named `module:name` (rewards, environments, tools): one importer for every option.

A plugin must be importable where it runs (installed, or on PYTHONPATH). Every failure is one
ConfigError line that names the option and the spec, never a traceback.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from prl_actors.sections import ConfigError

STOPPING = threading.Event()
"""Set when this process is asked to stop (process.request_stop): every wait on a plugin (a reward's
thread or coroutine) ends at once, so `stop` is honoured whatever a plugin does."""


def load_callable(spec: str, option: str, form: str = "'module:function'") -> Callable[..., Any]:
    """Import `module:name` and return it if callable; `form` is how the error spells a valid spec."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{option} {spec!r} must look like {form}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{option} {spec!r}: cannot import module {module_name!r} ({exc})") from None
    obj = getattr(module, attr, None)
    if obj is None:
        raise ConfigError(f"{option} {spec!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(obj):
        raise ConfigError(f"{option} {spec!r}: {attr!r} is not callable")
    fn: Callable[..., Any] = obj  # a callable attribute of an imported module: untyped until here
    return fn
