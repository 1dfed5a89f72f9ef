"""The one process supervisor every kind of run uses: start, watch, stop (grace, SIGTERM, SIGKILL),
restart back-off, and the supervisor's own stop signals.

Users: `up` for GRPO (launcher.Launcher), `up` for a classic-RL config (envs.run.EnvRun), the
trainer's rank group (trainer.rank_group), and `up --compose` (compose.ComposeRun: its members are
containers, stopped by compose; it takes only the signal handling from here). Each of them decides
*what* runs and what a member's exit means; this module only does *how*.

Invariants:
- every child runs in its own process group (with any subprocess it starts: an engine, a rank) and
  knows its supervisor's pid (SUPERVISOR_ENV): if the supervisor is killed outright, an actor stops
  by itself;
- `reap` never returns with a child alive: a grace period for a clean exit, then SIGTERM to each
  child's group, then SIGKILL, every wait bounded;
- the first stop signal asks for a graceful stop (`Signals.signum`), a second one skips the grace
  periods (`Signals.hurry`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from prl_actors.protocol.messages import role_prefix
from prl_actors.runtime.processes import KILL_WAIT_S, Child, wait_exit

START_GATE_ENV = "PRL_START_GATE"  # set by `up` for the trainer and workers: exists once the servers are bound
STANDBY_ENV = "PRL_STANDBY"  # set by `up` for a spare core actor (run.standby_core): the file that says "go"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
RESTART_BACKOFF_S = 0.5  # doubled for each start-up crash in a row
FAILED_STOP_S = 0.5  # a failed run (a core member died): each stop stage waits at most this long


class RunFailed(Exception):
    """The run cannot go on; the message is the one line the user sees."""


class Interrupted(Exception):
    """The supervisor got stop signal `signum`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def actor_argv(name: str, config_path: Path) -> list[str]:
    """The command line of the run's actor `name` (its role from the name: worker-3 -> worker), as `up`
    and the classic run start it: `prl-actors actor ROLE --config FILE --name NAME`."""
    role = role_prefix(name)
    return [sys.executable, "-m", "prl_actors.cli.main", "actor", role, "--config", str(config_path), "--name", name]


def restart_delay(restarts: int) -> float:
    """The back-off before the `restarts`-th start-up crash in a row is restarted (0: at once)."""
    return RESTART_BACKOFF_S * 2 ** (restarts - 1) if restarts else 0.0


@dataclass
class Healing:
    """The restarts of a run's core (run.max_restarts; launcher.Launcher._heal). `used`: restarts so
    far in the run; `in_a_row`: the crashes in a row of cores that made no progress (no epoch done),
    which set the back-off (none after a core that did, then 0.5 s, 1 s, 2 s ...); `since`: when the
    core last crashed, until the new core has opened an epoch (0: not restarting)."""

    used: int = 0
    in_a_row: int = 0
    since: float = 0.0

    def crashed(self, progressed: bool) -> float:
        """A core crash (restart number `used` + 1); `progressed`: its core had finished an epoch.
        The back-off before the restart, in seconds."""
        self.in_a_row = 0 if progressed else self.in_a_row + 1
        self.used += 1
        self.since = self.since or time.monotonic()
        return restart_delay(self.in_a_row)

    def back(self) -> float:
        """The new core opened an epoch: seconds since the crash it recovered from."""
        took, self.since = time.monotonic() - self.since, 0.0
        return took


@dataclass
class Signals:
    """The supervisor's stop signals while installed (`with signals.installed():`). The first sets
    `signum` (a graceful stop: `check` raises Interrupted); a second sets `hurry` (no grace periods).
    `immediate`: the handler raises Interrupted itself, at every signal, cutting a blocking call
    short (compose's image build); otherwise the supervisor's loop calls `check`."""

    immediate: bool = False
    signum: int = 0
    hurry: bool = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[Signals]:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum:
            self.hurry = True
        self.signum = self.signum or signum
        if self.immediate:
            raise Interrupted(signum)

    def check(self) -> None:
        if self.signum:
            raise Interrupted(self.signum)


@dataclass
class Supervisor:
    """The children of one run, by name, and their end. `grace_s`: how long a clean stop may take
    (run.stop_grace_s) before SIGTERM, then SIGKILL."""

    grace_s: float
    signals: Signals = field(default_factory=Signals)
    children: dict[str, Child] = field(default_factory=dict)
    retired: list[Child] = field(default_factory=list)  # no longer a member (scaled down): still reaped
    failed: bool = False  # a core member died: nobody waits on a grace period it cannot use

    def start(self, child: Child) -> Child:
        self.children[child.name] = child
        return child

    def retire(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Stop member `name` (SIGTERM: gracefully, it leaves) and stop watching it; `reap` still ends it."""
        child = self.children.pop(name)
        child.proc.send_signal(sig)
        self.retired.append(child)

    def all(self) -> list[Child]:
        return [*self.children.values(), *self.retired]

    def grace(self, carried: bool = True) -> float:
        """How long to wait for children to exit on their own: none after a second signal, none when
        nothing carries the stop to them (`carried` False: the member that would is the one that
        died), a short one when the run failed."""
        if self.signals.hurry or not carried:
            return 0.0
        return FAILED_STOP_S if self.failed else self.grace_s

    def reap(self) -> None:
        """Every child still running: a grace period, then SIGTERM to its group, then SIGKILL."""
        grace = self.grace()
        wait_exit(self.all(), grace)
        waits = (FAILED_STOP_S, FAILED_STOP_S) if self.failed else (grace + KILL_WAIT_S, KILL_WAIT_S)
        for sig, wait_s in zip((signal.SIGTERM, signal.SIGKILL), waits, strict=True):
            alive = [c for c in self.all() if c.alive()]
            for c in alive:
                c.signal(sig)
            wait_exit(alive, wait_s)
