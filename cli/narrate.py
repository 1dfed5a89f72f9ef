"""What a joined worker (`prl-actors actor worker ...` started by hand, not by `up`) says on its console:
joined, each weight version it loads, one line per epoch with the groups it generated, failures, and
why it stopped. Read from the actor's own log file (the one source of truth), so the actor's code
does not change; without it such a worker said nothing at all while it worked.

Imports only the standard library (the CLI's start-up stays fast).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

POLL_S = 0.2
LOUD = ("generate_failed", "weight_sync_failed", "re_register")  # not a crash or a give-up: the CLI says those


class Narrator:
    """Turns one worker's events into console lines (one per epoch, not one per group)."""

    def __init__(self, name: str, say: Callable[[str], None]) -> None:
        self.name, self.say = name, say
        self.epoch, self.groups = -1, 0

    def event(self, e: dict[str, Any]) -> None:
        kind = e.get("event")
        if kind == "registered":
            self.say(f"{self.name}: joined run {e.get('run_id', '?')}")
        elif kind == "span_end" and e.get("span") == "weight_sync":
            mb = float(e.get("bytes", 0)) / 1e6
            self.say(
                f"{self.name}: loaded weights v{e.get('new_version')} ({mb:.1f} MB in {float(e.get('seconds', 0)):.2f}s"
                f" via {e.get('via', '?')})"
            )
        elif kind == "span_begin" and e.get("span") == "score":
            epoch = int(e.get("epoch", -1))
            if epoch != self.epoch:
                self.flush()
                self.epoch = epoch
            self.groups += len(e.get("groups") or [])
        elif kind == "shutdown":
            self.flush()
            self.say(f"{self.name}: stopped: {e.get('reason', '')}")
        elif kind in LOUD:
            self.say(f"{self.name}: {kind}: {e.get('reason') or e.get('error') or e.get('detail') or ''}")

    def flush(self) -> None:
        """The line of the epoch in progress (when it had groups)."""
        if self.groups:
            self.say(f"{self.name}: epoch {self.epoch}: generated and sent {self.groups} groups")
        self.groups = 0


def follow_log(path: Path, name: str, stop: threading.Event, say: Callable[[str], None] | None = None) -> None:
    """Narrate the lines appended to `path` (from its current end) until `stop` is set."""
    narrator = Narrator(name, say or (lambda line: print(line, file=sys.stderr, flush=True)))
    offset = path.stat().st_size if path.exists() else 0
    pending = b""
    while True:
        stopping = stop.wait(POLL_S)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        offset += len(data)
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            try:
                narrator.event(json.loads(line))
            except (ValueError, TypeError):
                continue
        if stopping:
            narrator.flush()
            return


def start(path: Path, name: str) -> tuple[threading.Event, threading.Thread]:
    """A daemon thread narrating `path`; set the event (and join the thread) to stop it."""
    stop = threading.Event()
    thread = threading.Thread(target=follow_log, args=(path, name, stop), name="narrate", daemon=True)
    thread.start()
    return stop, thread
