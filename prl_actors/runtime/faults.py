"""Deterministic fault injection for recovery tests: an actor SIGKILLs itself at a named point.

    PRL_TEST_KILL_AT="publisher:before_ack:2"       the publisher, storing the weights epoch 2 made
    PRL_TEST_KILL_AT="trainer:after_checkpoint:1:interrupt"   Ctrl-C to `up` there (see below)
    PRL_TEST_KILL_MARKS=DIR                         each kill happens once per DIR (a restart survives)

Several kills: separated by commas. The points (each actor calls `kill_point(name, point, epoch)`):

    trainer      before_checkpoint  after_checkpoint  after_ack (the publisher stored the epoch's weights)
    publisher    before_ack  after_ack               (storing v_{N+1}, the weights epoch N made; its
                                                      first fetch by a worker: the ack is long out)
    coordinator  before_step_done  after_step_done   (the trainer's StepDone of epoch N)
    buffer       mid_epoch  before_complete          (its first accepted group of N; EpochComplete of N)

A kill is a SIGKILL of the actor's own process: nothing is flushed, nothing is said, exactly as an
outside kill, but at a point a test names instead of a moment it guesses. With PRL_TEST_KILL_MARKS
a file `<actor>.<point>.<epoch>` is created there first (O_EXCL): the restarted actor passes the same
point again without dying. The action `interrupt` instead sends SIGINT to the actor's supervisor (`up`:
a Ctrl-C at exactly that point) and holds this actor HOLD_S, so that the stop overtakes what the
actor was doing (the publisher does not ack before the trainer hears Shutdown). Unset (every real
run), `kill_point` is one environment look-up.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from prl_actors.runtime.processes import SUPERVISOR_ENV

KILL_AT_ENV = "PRL_TEST_KILL_AT"
MARKS_ENV = "PRL_TEST_KILL_MARKS"
ACTIONS = ("kill", "interrupt")
HOLD_S = 2.0  # `interrupt`: how long the actor waits after the Ctrl-C before it goes on
POINTS = {
    "trainer": ("before_checkpoint", "after_checkpoint", "after_ack"),
    "publisher": ("before_ack", "after_ack"),
    "coordinator": ("before_step_done", "after_step_done"),
    "buffer": ("mid_epoch", "before_complete"),
}


def parse(spec: str) -> dict[tuple[str, str, int], str]:
    """(actor, point, epoch) -> action of each comma-separated `actor:point:epoch[:action]`;
    ValueError names a bad one."""
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        if len(parts) == 3:
            parts.append("kill")
        ok = len(parts) == 4 and parts[1] in POINTS.get(parts[0], ()) and parts[2].isdigit() and parts[3] in ACTIONS
        if not ok:
            raise ValueError(f"{KILL_AT_ENV}: {item!r} is not actor:point:epoch[:kill|interrupt] (points: {POINTS})")
        out[(parts[0], parts[1], int(parts[2]))] = parts[3]
    return out


def armed() -> bool:
    """Some kill is asked for (PRL_TEST_KILL_AT is set)."""
    return bool(os.environ.get(KILL_AT_ENV))


def kill_point(actor: str, point: str, epoch: int) -> None:
    """SIGKILL this process (or Ctrl-C its `up`) if PRL_TEST_KILL_AT names (actor, point, epoch), once
    per marks dir."""
    spec = os.environ.get(KILL_AT_ENV)
    action = parse(spec).get((actor, point, epoch)) if spec else None
    if action is None or not _first_time(f"{actor}.{point}.{epoch}"):
        return
    if action == "interrupt":
        os.kill(_up_pid(), signal.SIGINT)
        time.sleep(HOLD_S)
        return
    os.kill(os.getpid(), signal.SIGKILL)


def _first_time(mark: str) -> bool:
    """True unless PRL_TEST_KILL_MARKS holds `mark` already (it does from now on)."""
    marks = os.environ.get(MARKS_ENV)
    if not marks:
        return True
    try:
        fd = os.open(Path(marks) / mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _up_pid() -> int:
    """The pid of `up`: this actor's supervisor, or the supervisor's parent when that is the fork
    server (launch/zygote.py: a forked actor's supervisor is the server, `up`'s child)."""
    pid = int(os.environ.get(SUPERVISOR_ENV) or os.getppid())
    proc = Path(f"/proc/{pid}")
    cmdline = (proc / "cmdline").read_bytes()
    if b"prl_actors.launch.zygote" in cmdline or cmdline.startswith(
        b"prl-actors fork-server"
    ):  # its title (launch/proctitle.py)
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])  # field 4: its parent
    return pid
