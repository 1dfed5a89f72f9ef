"""The policy: CleanRL's PPO agent for discrete actions, and the AAPS divergence estimator.

    Agent.actor   obs [B, obs_dim] -> logits [B, n_actions]   (Linear-Tanh-Linear-Tanh-Linear, orthogonal init)
    Agent.critic  obs [B, obs_dim] -> value [B, 1]

An env actor holds only an acting copy of `actor` (its tensors are what the learner serves, named
`actor.<param>`); it rebuilds the network from the tensor shapes, so it needs no model config.

Divergence estimate (AAPS, docs/ENVS.md): on an env actor's recent observations, the exact categorical
KL(pi_actor || pi_learner) = sum_a p_actor(a|s) (log p_actor(a|s) - log p_learner(a|s)) per observation,
averaged over each environment's observations, then averaged (not summed) over environments, so a
threshold means the same whatever the number of environments.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    from prl_actors.classic.envkit.arrays import Array


def layer_init(layer: nn.Linear, std: float = float(np.sqrt(2)), bias_const: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(obs_dim: int, hidden: int, out: int, out_std: float) -> nn.Sequential:
    return nn.Sequential(
        layer_init(nn.Linear(obs_dim, hidden)),
        nn.Tanh(),
        layer_init(nn.Linear(hidden, hidden)),
        nn.Tanh(),
        layer_init(nn.Linear(hidden, out), std=out_std),
    )


class Agent(nn.Module):
    """CleanRL's `Agent` (ppo.py) for a flat Box observation and a Discrete action space."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.critic = mlp(obs_dim, hidden, 1, 1.0)
        self.actor = mlp(obs_dim, hidden, n_actions, 0.01)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)  # type: ignore[no-any-return]

    def get_action_and_value(
        self, x: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.actor(x)  # [B, n_actions]
        dist = torch.distributions.Categorical(logits=logits)
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(x)


def actor_tensors(agent: Agent) -> dict[str, torch.Tensor]:
    """The acting copy's tensors, detached clones (what the learner publishes)."""
    return {f"actor.{k}": v.detach().clone() for k, v in agent.actor.state_dict().items()}


def actor_from_tensors(tensors: Mapping[str, Any]) -> nn.Sequential:
    """Rebuild the acting network from `actor.<param>` tensors (shapes give the sizes)."""
    state = {k.removeprefix("actor."): torch.as_tensor(v) for k, v in tensors.items()}
    hidden, obs_dim = state["0.weight"].shape
    n_actions = state["4.weight"].shape[0]
    net = mlp(int(obs_dim), int(hidden), int(n_actions), 0.01)
    net.load_state_dict(state)
    return net.eval()


@torch.no_grad()
def logits_of(net: nn.Module, obs: Array) -> Array:
    """Logits [K, n_actions] (float32) of `net` on observations [K, obs_dim]."""
    out = net(torch.as_tensor(np.asarray(obs, dtype=np.float32)))
    return out.numpy().astype(np.float32)  # type: ignore[no-any-return]


def kl_estimate(actor_logits: Array, learner_logits: Array, n_envs: int) -> float:
    """KL(pi_actor || pi_learner) per observation, averaged per env, then over envs.
    Both logits [k * n_envs, A], rows env-minor (row = step * n_envs + env)."""
    la = torch.log_softmax(torch.as_tensor(actor_logits, dtype=torch.float64), dim=-1)
    ll = torch.log_softmax(torch.as_tensor(learner_logits, dtype=torch.float64), dim=-1)
    per_obs = (la.exp() * (la - ll)).sum(-1).reshape(-1, n_envs)  # [k, n_envs]
    return float(per_obs.mean(0).mean().clamp_min(0.0))
