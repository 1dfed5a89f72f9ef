"""`EnvClient`: a `gymnasium.vector.VectorEnv` whose environments live in remote env actors.

Same spaces as `SyncVectorEnv` over the same env id (read from one local instance), same dtypes
(observations in the space's dtype, rewards float64, terminated/truncated bool) and the same NEXT_STEP
autoreset, so for the same seeds and actions it returns the same observations and rewards. What a
local vector env cannot do, it reports instead of hiding: when an env actor is lost mid-episode, the
slot's step returns `truncated=True` at its last observation with `infos["env_lost"]` set, and the next
step resets it on another env actor (exactly the NEXT_STEP contract after a truncation).

    envs = EnvClient(settings)               # binds the learner address; env actors connect to it
    obs, infos = envs.reset(seed=1)
    obs, rewards, terminated, truncated, infos = envs.step(actions)

launch/classic.py's `env_client(cfg)` builds one from the run's config (settings, keys, frame bounds).

Per-env `info` dicts of the sub-environments are not carried (CartPole has none); `options` and
`reset_mask` are refused, as are the SAME_STEP and DISABLED autoreset modes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import zmq
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from prl_actors.classic.envkit.local import UNSEEDED
from prl_actors.classic.envs.hub import Hub
from prl_actors.transport.port import Limits

if TYPE_CHECKING:
    from prl_actors.classic.learner_acting import LearnerSettings
    from prl_actors.transport.auth import Security


class EnvClient(VectorEnv):  # type: ignore[misc]
    def __init__(
        self,
        settings: LearnerSettings,
        ctx: zmq.SyncContext | None = None,
        log_dir: Path | None = None,
        call_timeout_s: float = 120.0,
        security: Security | None = None,
        limits: Limits = Limits(),
    ) -> None:
        super().__init__()
        if settings.mode != "remote":
            raise ValueError("EnvClient drives env actors in remote mode (settings.mode='remote')")
        probe = gym.make(settings.env_id)
        self.single_observation_space, self.single_action_space = probe.observation_space, probe.action_space
        self.metadata = {**probe.metadata, "autoreset_mode": AutoresetMode.NEXT_STEP}
        self.render_mode = None
        probe.close()
        self.num_envs = settings.num_envs
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.call_timeout_s = call_timeout_s
        self.hub = Hub(settings, ctx, log_dir, security, limits)
        self._was_reset = False

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> Any:
        if options:
            raise ValueError("EnvClient.reset: options (and reset_mask) are not supported")
        seeds = self._seeds(seed)
        result = self.hub.call(
            lambda now, done: self.hub.core.call_reset(now, seeds, done), self.call_timeout_s, "reset"
        )
        self._was_reset = True
        return result

    def step(self, actions: Any) -> Any:
        if not self._was_reset:
            raise RuntimeError("EnvClient.step before reset()")
        acts = np.asarray(actions, dtype=self.action_space.dtype)
        if acts.shape != self.action_space.shape:
            raise ValueError(f"actions of shape {acts.shape}, expected {self.action_space.shape}")
        return self.hub.call(lambda now, done: self.hub.core.call_step(now, acts, done), self.call_timeout_s, "step")

    def _seeds(self, seed: int | list[int | None] | None) -> list[int]:
        if seed is None:
            return [UNSEEDED] * self.num_envs
        if isinstance(seed, int):
            return [seed + i for i in range(self.num_envs)]
        if len(seed) != self.num_envs:
            raise ValueError(f"{len(seed)} seeds for {self.num_envs} environments")
        return [UNSEEDED if s is None else int(s) for s in seed]

    def close_extras(self, **kwargs: Any) -> None:
        self.hub.close("env client closed")

    @property
    def live_actors(self) -> list[str]:
        return self.hub.core.live()
