"""The composition root: what `prl-actors up` runs, for every kind of run, in one function.

`members(cfg)` names every process a local `up` starts, in start order, with what its exit means;
the supervisor's plug-ins (launcher.Launcher for GRPO, envs.run.EnvRun for classic RL) start and
watch exactly these, through the one supervisor (launch/supervisor.py). `up --compose` runs the same GRPO
members as compose services (docker-compose.yml: the workers are the `inference` service's replicas).
Workers and env actors added later (`prl-actors scale`, a replacement) take the next free number.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from prl_actors.protocol.messages import role_prefix

if TYPE_CHECKING:
    from prl_actors.config import Config


class OnExit(Enum):
    """What the exit of a member means to the run. A GRPO run's coordinator and FAILS_RUN members are
    its core (`core_names`): a crash of one of them restarts them all from the last checkpoint
    (run.max_restarts; launcher.Launcher._heal) before it fails the run."""

    ENDS_RUN = "its exit ends the run, with its outcome"  # the coordinator; the learner of an env run
    FAILS_RUN = "its exit (before the run's end) fails the run"  # a core actor
    REPLACED = "a crash is replaced; exit code 0 left on purpose"  # a worker, an env actor


@dataclass(frozen=True)
class Member:
    """One process of a run. `tier`: start order; the members that `bind` in a tier have bound their
    port before the next tier starts. `gated`: it loads first (imports, model) and connects only once
    every server is bound (the start gate: launch/up.py)."""

    name: str
    tier: int
    on_exit: OnExit
    binds: bool = False
    gated: bool = False

    @property
    def role(self) -> str:
        return role_prefix(self.name)


def members(cfg: Config) -> list[Member]:
    """Every process a local `up` starts for `cfg`, in start order (docs/ARCHITECTURE.md, who starts what).

    GRPO: the trainer and the workers load behind the start gate while the servers start; the
    coordinator binds first, then the publisher and the buffer (they register with it).
    Classic RL (an `env` section): the learner binds, the env actors connect to it."""
    if cfg.env is not None:
        envs = [Member(f"env-{i}", 1, OnExit.REPLACED) for i in range(cfg.env.actors)]
        return [Member("learner", 0, OnExit.ENDS_RUN, binds=True), *envs]
    workers = [Member(f"worker-{i}", 0, OnExit.REPLACED, gated=True) for i in range(cfg.run.workers)]
    return [
        Member("trainer", 0, OnExit.FAILS_RUN, gated=True),
        *workers,
        Member("coordinator", 1, OnExit.ENDS_RUN, binds=True),
        Member("publisher", 2, OnExit.FAILS_RUN, binds=True),
        Member("buffer", 2, OnExit.FAILS_RUN, binds=True),
    ]


def core_names(plan: list[Member]) -> list[str]:
    """The core of a run: every member that is not replaced one by one (GRPO: coordinator,
    publisher, buffer, trainer). They hold the open epoch between them, so they restart together."""
    return [m.name for m in plan if m.on_exit is not OnExit.REPLACED]
