"""Simulated engine: a contextual-bandit policy with deterministic per-token cost.

The policy is a table of logits theta[context, action] (plus `param_count` filler parameters so weight
transfer moves real bytes). A prompt "ctx k" is answered by sampling actions from softmax(theta[k]);
the response text is the action's index. Sampling is seeded by (seed, version, group id), so a group
regenerated after a worker was lost is identical. Cost: `gen_s_per_token` x tokens x G, slept.
For control-plane tests and benchmarks only; never the default.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from prl_actors.config import Config
from prl_actors.engines.base import Generated, GeneratedGroup
from prl_actors.protocol.messages import Prompt


def context_of(prompt: str) -> int:
    return int(prompt.split()[-1])


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


class SimEngine:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg.sim
        self.seed = cfg.run.seed
        self.version = -1
        self.theta = np.zeros((self.cfg.arms, self.cfg.arms), dtype=np.float32)

    def load_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        theta = np.asarray(tensors["theta"], dtype=np.float32)
        if theta.shape != self.theta.shape:
            raise ValueError(f"theta has shape {theta.shape}, engine expects {self.theta.shape}")
        self.theta = theta.copy()
        self.version = version

    def generate(self, prompts: list[Prompt], group_size: int) -> list[GeneratedGroup]:
        out = []
        for p in prompts:
            rng = np.random.default_rng([self.seed, self.version, p.group_id])
            probs = softmax(self.theta[context_of(p.prompt)].astype(np.float64))
            actions = rng.choice(len(probs), size=group_size, p=probs)
            n_tok = self.cfg.tokens_per_sample
            samples = [
                Generated(
                    text=str(a), token_ids=[int(a)] * n_tok, logprobs=[float(np.log(probs[a]))] + [0.0] * (n_tok - 1)
                )
                for a in actions
            ]
            out.append(
                GeneratedGroup(group_id=p.group_id, prompt=p.prompt, prompt_ids=[context_of(p.prompt)], samples=samples)
            )
        time.sleep(self.cfg.gen_s_per_token * self.cfg.tokens_per_sample * group_size * len(prompts))
        return out

    def close(self) -> None:
        pass
