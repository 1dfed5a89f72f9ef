"""One structlog JSON-lines file per actor: RUN_DIR/logs/<actor>.jsonl.

Every event carries: event, actor, role, epoch, version, t_mono (time.monotonic, comparable across the
processes of one host), t_wall (Unix time). Message events carry msg_id / reply_to / type. `prl-actors
replay` reads these files alone; docs/LOGS.md lists the events.
"""

from __future__ import annotations

import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, TextIO

import msgspec
import structlog

_json = msgspec.json.Encoder()


def _render(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> str:
    return _json.encode(event_dict).decode()


class EventLog:
    """Appends events for one actor. Not thread-safe: each actor logs from its own actor thread."""

    def __init__(self, actor: str, role: str, path: Path | None = None, echo: TextIO | None = None):
        self.actor, self.role = actor, role
        self.epoch, self.version = -1, -1
        self._file: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", buffering=1)  # noqa: SIM115 - closed in close()
        self._log = structlog.wrap_logger(
            structlog.WriteLogger(self._file or echo or open("/dev/null", "w")),  # noqa: SIM115
            processors=[_render],
        )

    def __call__(self, event: str, **fields: Any) -> None:
        fields.setdefault("epoch", self.epoch)
        fields.setdefault("version", self.version)
        self._log.msg(
            event=event,
            actor=self.actor,
            role=self.role,
            t_mono=time.monotonic(),
            t_wall=time.time(),
            **fields,
        )

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def console(line: str) -> None:
    """User-facing progress line (stderr, so stdout stays machine-readable)."""
    print(line, file=sys.stderr, flush=True)
