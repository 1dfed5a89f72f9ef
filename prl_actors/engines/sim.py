"""Simulated engine: a contextual-bandit policy with deterministic per-token cost.

The policy is a table of logits theta[context, action] (plus `param_count` filler parameters so weight
transfer moves real bytes). A prompt "ctx k" is answered by sampling actions from softmax(theta[k]);
the response text is the action's index. Sampling is seeded by (seed, version, group id), so a group
regenerated after a worker was lost is identical. It batches like the torch engine (groups enter a
running batch of `worker.max_batch_rows` rows as rows free up; a group needs `tokens_per_sample`
steps) and costs what the unbatched engine did: each step sleeps `gen_s_per_token` x running rows.
For control-plane tests and benchmarks only; never the default.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from prl_actors.engines.base import EngineBusy, Generated, GeneratedGroup, generate_all
from prl_actors.training.sim import context_of, softmax  # the sim learner's policy: one definition

if TYPE_CHECKING:
    from prl_actors.engines.settings import EngineSettings
    from prl_actors.protocol.messages import Prompt


@dataclass
class _SimGroup:
    prompt: Prompt
    size: int
    steps_left: int
    t_admit: float = 0.0


class SimEngine:
    def __init__(self, settings: EngineSettings) -> None:
        self.cfg = settings.sim
        self.seed = settings.seed
        self.version = -1
        self.theta = np.zeros((self.cfg.arms, self.cfg.arms), dtype=np.float32)
        self.max_rows = max(settings.worker.max_batch_rows, settings.worker.group_size)
        self.pending: deque[_SimGroup] = deque()
        self.running: list[_SimGroup] = []

    def load_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        if self.busy:
            raise EngineBusy(f"cannot load version {version} while groups of v{self.version} generate")
        theta = np.asarray(tensors["theta"], dtype=np.float32)
        if theta.shape != self.theta.shape:
            raise ValueError(f"theta has shape {theta.shape}, engine expects {self.theta.shape}")
        self.theta = theta.copy()
        self.version = version

    def admit(self, prompts: list[Prompt], group_size: int) -> None:
        self.pending.extend(_SimGroup(p, group_size, self.cfg.tokens_per_sample) for p in prompts)

    def step(self) -> list[GeneratedGroup]:
        free = self.max_rows - sum(g.size for g in self.running)
        while self.pending and self.pending[0].size <= free:
            group = self.pending.popleft()
            group.t_admit, free = time.monotonic(), free - group.size
            self.running.append(group)
        time.sleep(self.cfg.gen_s_per_token * sum(g.size for g in self.running))
        for g in self.running:
            g.steps_left -= 1
        done = [g for g in self.running if g.steps_left <= 0]
        self.running = [g for g in self.running if g.steps_left > 0]
        return [self._sample(g) for g in done]

    def abort(self) -> list[int]:
        dropped = [g.prompt.group_id for g in [*self.running, *self.pending]]
        self.running, self.pending = [], deque()
        return dropped

    @property
    def busy(self) -> bool:
        return bool(self.running or self.pending)

    @property
    def rows(self) -> int:
        return sum(g.size for g in [*self.running, *self.pending])

    def generate(self, prompts: list[Prompt], group_size: int) -> list[GeneratedGroup]:
        return generate_all(self, prompts, group_size)

    def _sample(self, g: _SimGroup) -> GeneratedGroup:
        p = g.prompt
        rng = np.random.default_rng([self.seed, self.version, p.group_id])
        probs = softmax(self.theta[context_of(p.prompt)].astype(np.float64))
        actions = rng.choice(len(probs), size=g.size, p=probs)
        n_tok = self.cfg.tokens_per_sample
        samples = [
            Generated(text=str(a), token_ids=[int(a)] * n_tok, logprobs=[float(np.log(probs[a]))] + [0.0] * (n_tok - 1))
            for a in actions
        ]
        gen_s = time.monotonic() - g.t_admit
        return GeneratedGroup(p.group_id, p.prompt, [context_of(p.prompt)], samples, gen_s=gen_s)

    def close(self) -> None:
        self.abort()
