"""Lifecycle, a part of every actor's Core: running, stopped (cleanly), or failed with one line.

The host reads it after every call into the core: `failure` set -> the actor stops and its process
exits non-zero with it; `stopped` -> the actor stops. A stop after a failure keeps the failure."""

from __future__ import annotations


class Lifecycle:
    def __init__(self) -> None:
        self.stopped = False
        self.failure: str | None = None

    def stop(self) -> None:
        self.stopped = True

    def fail(self, reason: str) -> None:
        self.failure = reason
        self.stopped = True
