"""Reward failures: one line that names the reward, the prompt and the value or exception, and
where a plugin raised (file:line), with the whole traceback kept for the worker's log."""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path


class RewardError(Exception):
    """A reward raised, returned something other than a finite real number, answered in the wrong
    shape, or ran past its deadline.

    str(exc) is the whole story in one line, e.g.
    `reward 'acc' (my_rewards:accuracy) raised on prompt 3 (row 17) sample 2: ValueError: boom
    (my_rewards.py:12)`; `trace` is the plugin's traceback ('' when nothing raised)."""

    def __init__(self, line: str, trace: str = "") -> None:
        super().__init__(line)
        self.trace = trace


class RewardStopped(RewardError):
    """The process is stopping (plugins.STOPPING) while a reward ran: no value, under any policy."""


def where(group_id: int, item: int, sample: int | None) -> str:
    """`prompt 3 (row 17) sample 2`: the prompt's group id, its data row, the sample (None: the group)."""
    text = f"prompt {group_id}" + (f" (row {item})" if item >= 0 else "")
    return text if sample is None else f"{text} sample {sample}"


_PACKAGE = str(Path(__file__).resolve().parents[1])  # prl_actors/
_LIBRARIES = tuple(
    {str(Path(p).resolve()) for p in (sysconfig.get_path(k) for k in ("stdlib", "purelib", "platlib")) if p}
)


def origin(exc: BaseException) -> str:
    """`file.py:LINE` of the innermost frame of `exc`'s traceback in the user's own code (not in this
    package, the standard library or installed packages); else the innermost one outside this
    package (a plugin installed as a package); '' when it all happened here (a built-in reward's
    error says what it is by itself)."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not _library(f.filename)]
    outside = [f for f in frames if not str(Path(f.filename).resolve()).startswith(_PACKAGE)]
    if not (own or outside):
        return ""
    frame = (own or outside)[-1]
    return f"{Path(frame.filename).name}:{frame.lineno}"


def _library(filename: str) -> bool:
    path = str(Path(filename).resolve())
    return path.startswith(_PACKAGE) or any(path.startswith(lib) for lib in _LIBRARIES)


def trace_of(exc: BaseException) -> str:
    """The formatted traceback of `exc` (for the worker's log)."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
