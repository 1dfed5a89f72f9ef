"""The learner's loop in acting mode (DETACH + AAPS): publish a policy, train each complete round, repeat.

    publish v0 -> round 0 acted by the env actors with their copies -> PPO update -> publish v1 -> ...

Each round's segments carry the behaviour policy's log-probabilities, so PPO's ratio is taken against
the policy that really acted, whatever version an actor held (AAPS lets an actor keep acting with an
older version while its KL estimate stays under `env.sync_kl_threshold`; threshold 0 = every actor
acts every round with the newest version, which is on-policy PPO). One row per update goes to `emit`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from prl_actors.classic.envkit.local import make_env
from prl_actors.classic.envkit.policy import Agent, actor_from_tensors, actor_tensors, logits_of
from prl_actors.classic.envkit.ppo import Returns, Rollout, Row, anneal, make_agent, result, row, update
from prl_actors.protocol.versions import INITIAL_VERSION, next_version, version_for
from prl_actors.weights.transfer import Snapshot

if TYPE_CHECKING:
    from prl_actors.classic.envkit.rounds import RoundBatch
    from prl_actors.classic.envkit.settings import EnvSection
    from prl_actors.classic.envs.hub import Hub


class _Spaces:
    """The single spaces of the env id (what make_agent reads from a vector env)."""

    def __init__(self, env_id: str) -> None:
        probe = make_env(env_id)
        self.single_observation_space, self.single_action_space = probe.observation_space, probe.action_space
        probe.close()


def publish(hub: Hub, agent: Agent, version: int) -> None:
    """Serve `version` (the actor's tensors) and a frozen copy for answering PolicyChecks."""
    tensors = actor_tensors(agent)
    snap = Snapshot.from_tensors(version, tensors)
    frozen = actor_from_tensors(tensors)
    hub.tell(lambda now: hub.core.publish(now, version, snap, lambda obs: logits_of(frozen, obs)))


def train_acting(hub: Hub, env: EnvSection, seed: int, emit: Row) -> dict[str, Any]:
    """PPO under DETACH: the env section's `ppo` settings, run seed `seed`; returns the run's result."""
    p = env.ppo
    agent, opt = make_agent(_Spaces(env.env_id), p, seed)
    gen = torch.Generator().manual_seed(seed)
    returns = Returns(p)
    version, steps, updates, t0 = INITIAL_VERSION, 0, 0, time.monotonic()
    publish(hub, agent, version)
    while steps < p.total_timesteps and not (p.stop_when_solved and returns.solved):
        batch: RoundBatch = hub.call(lambda now, done: hub.core.next_round(now, done), env.call_timeout_s, "round")
        ro = Rollout.concat([s.arrays for s in batch.segments])
        for seg in batch.segments:
            returns.add(seg.returns)
        anneal(opt, p, steps)
        steps += int(ro.valid.size)
        stats = update(agent, opt, ro, p, gen)
        version, updates = next_version(version), updates + 1
        publish(hub, agent, version)
        emit(row(updates, steps, t0, returns, stats) | acting_stats(batch))
    return result(updates, steps, returns, t0) | {"agent": agent}


def acting_stats(batch: RoundBatch) -> dict[str, Any]:
    """AAPS per round: fetches of the round's version, the actors' KL estimates, staleness, losses."""
    kls = [s.sync_kl for s in batch.segments if s.sync_kl >= 0]
    stale = [version_for(batch.round) - s.version for s in batch.segments]
    return {
        "round": batch.round,
        "actors": len(batch.segments),
        "weight_fetches": batch.stats.get("fetches", 0),
        "synced_actors": sum(s.synced for s in batch.segments),
        "aaps_kl_mean": round(float(np.mean(kls)), 8) if kls else None,
        "aaps_kl_max": round(float(np.max(kls)), 8) if kls else None,
        "staleness_max": max(stale),
        "lost_slots": len(batch.lost_slots),
    }
