"""Simulated learner: group-normalised policy gradient on the SimEngine's logit table.

Gradients are summed per group in `accumulate` and divided by the epoch's sample count in `step`,
so the update does not depend on arrival order. Cost: `train_s_per_sample` x samples, slept.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from prl_actors.engines.config import SimSection
    from prl_actors.protocol.messages import Group


def context_of(prompt: str) -> int:
    return int(prompt.split()[-1])


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


class SimLearner:
    def __init__(self, sim: SimSection, seed: int) -> None:
        self.cfg = sim
        self.version = 0
        self.theta = np.zeros((self.cfg.arms, self.cfg.arms), dtype=np.float32)
        rng = np.random.default_rng(seed)
        self.extra = rng.standard_normal(self.cfg.param_count).astype(np.float32)
        self._reset()

    def _reset(self) -> None:
        self.grad = np.zeros_like(self.theta, dtype=np.float64)
        self.samples = 0
        self.rewards: list[float] = []

    def begin_epoch(self, epoch: int, n_groups: int) -> None:
        self._reset()

    def accumulate(self, group: Group) -> dict[str, float]:
        k = context_of(group.prompt)
        rewards = np.array([s.reward for s in group.samples], dtype=np.float64)
        adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        probs = softmax(self.theta[k].astype(np.float64))
        grad = np.zeros_like(probs)  # added only once every sample is read: a bad one adds nothing
        for a_i, s in zip(adv, group.samples, strict=True):
            onehot = np.zeros_like(probs)
            onehot[int(s.text)] = 1.0
            grad += a_i * (onehot - probs)
        self.grad[k] += grad
        self.samples += len(group.samples)
        self.rewards.extend(rewards.tolist())
        time.sleep(self.cfg.train_s_per_sample * len(group.samples))
        return {"reward_mean": float(rewards.mean())}

    def flush(self, max_groups: int | None = None) -> int:
        return 0  # accumulate trains at once

    # --- failure isolation (training/guard.py): accumulate trains at once and adds nothing on failure
    def drop_pending(self) -> None:
        pass

    def train_one(self, group: Group) -> None:
        self.accumulate(group)

    def forget(self, group: Group) -> None:
        pass  # a failed accumulate counted nothing

    def nonfinite_cause(self) -> str:
        return "" if np.isfinite(self.grad).all() else "non-finite gradient in theta"

    def skip_step(self) -> dict[str, float]:
        self.version += 1
        reward = float(np.mean(self.rewards)) if self.rewards else 0.0
        self._reset()
        return {"reward_mean": reward, "samples": 0.0, "skipped": 1.0}

    @property
    def pending(self) -> int:
        return 0

    def step(self) -> dict[str, float]:
        self.theta = (self.theta + self.cfg.lr * self.grad / max(1, self.samples)).astype(np.float32)
        self.extra = self.extra * np.float32(0.999)
        self.version += 1
        reward = float(np.mean(self.rewards)) if self.rewards else 0.0
        return {"reward_mean": reward, "accuracy": reward, "samples": float(self.samples)}

    def weights(self) -> dict[str, np.ndarray]:
        return {"theta": self.theta, "extra": self.extra}

    def save_checkpoint(self, path: Path) -> None:
        np.savez(path / "sim.npz", theta=self.theta, extra=self.extra, version=self.version)

    def load_checkpoint(self, path: Path) -> None:
        data = np.load(path / "sim.npz")
        self.theta, self.extra, self.version = data["theta"], data["extra"], int(data["version"])
