"""Acting on an env actor (DETACH): step its slots with a local copy of the policy, one segment at a time.

A segment is T steps of every owned slot with the one policy version the actor holds, so every
transition it carries is tagged with that version; `valid` marks the real steps (False on NEXT_STEP
autoreset steps). The actor keeps the segment's last `kl_obs` observations per env for the AAPS check.
torch is imported here only, so an env actor in remote mode never loads it.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from prl_actors.classic.envkit.policy import actor_from_tensors, kl_estimate, logits_of

if TYPE_CHECKING:
    from prl_actors.classic.envkit.arrays import Array
    from prl_actors.classic.envkit.local import SlotEnvs


@dataclass
class SegmentData:
    arrays: dict[
        str, Array
    ]  # obs [T,n,*], actions [T,n], logprobs, rewards, terminated, truncated, valid [T,n]; next_obs [n,*]
    returns: list[float]
    lengths: list[int]


class ActingPolicy:
    """The actor's acting copy of the learner's policy, at `version` (-1: none yet)."""

    def __init__(self, seed: int, name: str, kl_obs: int) -> None:
        self.version = -1
        self.net: torch.nn.Module | None = None
        self.gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        self.kl_obs = kl_obs
        self.recent: Array | None = None  # [k, n, *obs] of the last segment

    def load(self, version: int, tensors: Mapping[str, Any]) -> None:
        self.net, self.version = actor_from_tensors(tensors), version

    def act(self, envs: SlotEnvs, slots: Sequence[int], steps: int) -> SegmentData:
        assert self.net is not None, "act() before any weights were loaded"
        cols: dict[str, list[Array]] = {k: [] for k in ("obs", "actions", "logprobs", "rewards")}
        cols.update({k: [] for k in ("terminated", "truncated", "valid")})
        for _ in range(steps):
            obs = envs.current(slots)  # [n, *obs]
            action, logp = self._sample(obs)
            _next, reward, term, trunc, valid = envs.step(slots, action)
            for key, value in zip(cols, (obs, action, logp, reward, term, trunc, valid), strict=True):
                cols[key].append(value)
        arrays = {k: np.stack(v) for k, v in cols.items()}
        arrays["rewards"] = arrays["rewards"].astype(np.float32)
        arrays["next_obs"] = envs.current(slots)
        self.recent = arrays["obs"][-self.kl_obs :]
        finished = envs.drain_finished()
        return SegmentData(arrays, [r for r, _ in finished], [n for _, n in finished])

    @torch.no_grad()
    def _sample(self, obs: Array) -> tuple[Array, Array]:
        logits = self.net(torch.as_tensor(obs, dtype=torch.float32))  # type: ignore[misc]  # [n, A]
        logp_all = torch.log_softmax(logits, dim=-1)
        action = torch.multinomial(logp_all.exp(), 1, generator=self.gen).squeeze(1)  # [n]
        logp = logp_all.gather(1, action[:, None]).squeeze(1)
        return action.numpy().astype(np.int64), logp.numpy().astype(np.float32)

    def check_obs(self) -> Array:
        """The recent observations to ask the learner about, [k * n, *obs] (row = step * n + env)."""
        assert self.recent is not None
        k, n = self.recent.shape[:2]
        return self.recent.reshape(k * n, *self.recent.shape[2:])

    def divergence(self, learner_logits: Array) -> float:
        """AAPS estimate of KL(pi_self || pi_learner) on `check_obs()` (prl_actors/classic/envkit/policy.py)."""
        assert self.net is not None and self.recent is not None
        mine = logits_of(self.net, self.check_obs())
        return kl_estimate(mine, learner_logits, n_envs=self.recent.shape[1])


def should_fetch(threshold: float, kl: float, held: int, offered: int) -> bool:
    """AAPS, pull-based: fetch when the learner's version differs and the divergence exceeds the
    threshold; threshold 0 syncs on every new version (the baseline)."""
    if offered == held:
        return False
    return threshold == 0.0 or kl > threshold
