"""The Gymnasium environments one env actor runs, keyed by the run's slot numbers.

Per slot it behaves exactly like one sub-environment of `gymnasium.vector.SyncVectorEnv` with the
default NEXT_STEP autoreset: after a step that terminated or truncated, the slot's next step resets it
instead (the action is ignored; reward 0, terminated and truncated False). The same code serves the
learner's remote steps and the actor's own acting, so both see Gymnasium's semantics.

Invariants: every owned slot has been reset (it has an observation) before it is stepped; a slot that
is dropped is closed; `valid` is False exactly on autoreset steps (they carry no transition to learn).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from prl_actors.classic.envkit.arrays import Array

UNSEEDED = -1


def make_env(env_id: str) -> Any:
    """One Gymnasium environment (imported late: `prl-actors --help` stays fast)."""
    import gymnasium as gym

    return gym.make(env_id)


class SlotEnvs:
    def __init__(self, make: Callable[[str], Any] = make_env) -> None:
        self.make = make
        self.envs: dict[int, Any] = {}
        self.obs: dict[int, Array] = {}
        self.autoreset: dict[int, bool] = {}
        self.ep_return: dict[int, float] = {}
        self.ep_length: dict[int, int] = {}
        self.finished: list[tuple[float, int]] = []  # (return, length) of episodes ended since drained

    @property
    def slots(self) -> list[int]:
        return sorted(self.envs)

    def own(self, env_id: str, owned: Sequence[int]) -> None:
        """Hold exactly `owned`: close the others, create the missing ones (reset them next)."""
        keep = set(owned)
        for slot in [s for s in self.envs if s not in keep]:
            self.envs.pop(slot).close()
            for table in (self.obs, self.autoreset, self.ep_return, self.ep_length):
                table.pop(slot, None)  # type: ignore[attr-defined]
        for slot in sorted(keep - self.envs.keys()):
            self.envs[slot] = self.make(env_id)

    def reset(self, slots: Sequence[int], seeds: Sequence[int]) -> Array:
        """Reset `slots` (seed -1: unseeded); their observations [len(slots), *obs_shape]."""
        out = []
        for slot, seed in zip(slots, seeds, strict=True):
            obs, _info = self.envs[slot].reset(seed=None if seed == UNSEEDED else int(seed))
            self._started(slot, obs)
            out.append(obs)
        return self._stack(out, slots)

    def step(self, slots: Sequence[int], actions: Array) -> tuple[Array, Array, Array, Array, Array]:
        """obs [n, *], reward float64 [n], terminated [n], truncated [n], valid [n] for `slots`."""
        n = len(slots)
        reward = np.zeros(n, dtype=np.float64)
        term, trunc, valid = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool), np.ones(n, dtype=bool)
        out = []
        for i, slot in enumerate(slots):
            if slot not in self.obs:
                raise KeyError(f"slot {slot} was never reset")
            if self.autoreset[slot]:
                obs, _info = self.envs[slot].reset()
                self._started(slot, obs)
                valid[i] = False
            else:
                obs, r, te, tr, _info = self.envs[slot].step(actions[i])
                reward[i], term[i], trunc[i] = float(r), bool(te), bool(tr)
                self._record(slot, float(r), bool(te or tr), obs)
            out.append(obs)
        return self._stack(out, slots), reward, term, trunc, valid

    def current(self, slots: Sequence[int]) -> Array:
        """The latest observation of each slot [len(slots), *obs_shape]."""
        return self._stack([self.obs[s] for s in slots], slots)

    def drain_finished(self) -> list[tuple[float, int]]:
        out, self.finished = self.finished, []
        return out

    def close(self) -> None:
        self.own("", [])

    # --- helpers -----------------------------------------------------------------------------

    def _started(self, slot: int, obs: Array) -> None:
        self.obs[slot], self.autoreset[slot] = obs, False
        self.ep_return[slot], self.ep_length[slot] = 0.0, 0

    def _record(self, slot: int, reward: float, done: bool, obs: Array) -> None:
        self.obs[slot], self.autoreset[slot] = obs, done
        self.ep_return[slot] += reward
        self.ep_length[slot] += 1
        if done:
            self.finished.append((self.ep_return[slot], self.ep_length[slot]))

    def _stack(self, rows: list[Array], slots: Sequence[int]) -> Array:
        if rows:
            return np.stack(rows)
        space = self.envs[slots[0]].observation_space if slots else None
        return np.zeros((0, *(space.shape if space is not None else ())), dtype=np.float32)
