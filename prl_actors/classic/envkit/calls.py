"""One vector call (`reset()` or `step()` of the EnvClient) in flight on the learner: its result arrays,
the requests out to env actors, and which slots are filled.

Invariants: a slot is filled exactly once per call (by a reset observation, a step result, or a
truncation because its actor was lost mid-episode); the call is complete when every slot is filled
and no request is outstanding; each request names the actor and slots it covers, so a lost actor's
share is known precisely.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from prl_actors.classic.envkit.arrays import Array

Done = Callable[[Any], None]  # receives the call's result tuple, or an Exception


@dataclass
class Request:
    actor: str
    slots: list[int]
    kind: str  # "reset" (EnvReset) or "step" (EnvStep)


@dataclass
class VectorCall:
    kind: str  # "reset" or "step"
    step: int
    obs: Array  # [N, *obs_shape]
    actions: Array | None
    done: Done
    started: float
    reward: Array = field(init=False)  # float64 [N]
    terminated: Array = field(init=False)  # bool [N]
    truncated: Array = field(init=False)  # bool [N]
    lost: Array = field(init=False)  # bool [N]: truncated because the env actor was lost
    filled: Array = field(init=False)  # bool [N]
    by_reset: Array = field(init=False)  # bool [N]: filled by a reset observation
    requests: dict[str, Request] = field(default_factory=dict)  # by message id

    def __post_init__(self) -> None:
        n = self.obs.shape[0]
        self.reward = np.zeros(n, dtype=np.float64)
        self.terminated, self.truncated = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        self.lost, self.filled = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        self.by_reset = np.zeros(n, dtype=bool)

    def requested(self) -> set[int]:
        return {s for r in self.requests.values() for s in r.slots}

    def open_slots(self) -> list[int]:
        """Slots neither filled nor requested."""
        busy = self.requested()
        return [s for s in range(len(self.filled)) if not self.filled[s] and s not in busy]

    def of_actor(self, actor: str) -> list[tuple[str, Request]]:
        return [(mid, r) for mid, r in self.requests.items() if r.actor == actor]

    def fill_reset(self, slots: list[int], obs: Array) -> None:
        self.obs[slots] = obs
        self.reward[slots], self.terminated[slots], self.truncated[slots] = 0.0, False, False
        self.filled[slots] = self.by_reset[slots] = True

    def fill_step(self, slots: list[int], arrays: dict[str, Array]) -> None:
        self.obs[slots] = arrays["obs"]
        self.reward[slots] = arrays["reward"]
        self.terminated[slots], self.truncated[slots] = arrays["terminated"], arrays["truncated"]
        self.filled[slots] = True

    def truncate(self, slots: list[int], last_obs: Array) -> None:
        """The slots' actor is gone mid-episode: the episode ends here, truncated, at its last observation."""
        self.obs[slots] = last_obs[slots]
        self.reward[slots], self.terminated[slots], self.truncated[slots] = 0.0, False, True
        self.lost[slots] = True
        self.filled[slots] = True

    @property
    def complete(self) -> bool:
        return bool(self.filled.all()) and not self.requests

    def result(self) -> tuple[Any, ...]:
        """What VectorEnv.reset / step return (copies: the caller may keep them)."""
        infos: dict[str, Any] = {}
        if self.lost.any():
            infos = {"env_lost": self.lost.copy(), "_env_lost": self.lost.copy()}
        if self.kind == "reset":
            return self.obs.copy(), infos
        return self.obs.copy(), self.reward.copy(), self.terminated.copy(), self.truncated.copy(), infos
