"""A small PPO in CleanRL's shape (ppo.py: Agent, GAE, clipped surrogate, minibatch epochs), for any
Gymnasium VectorEnv with NEXT_STEP autoreset: a local SyncVectorEnv or the remote `EnvClient`.

Rollout arrays are [T, N] (T = num_steps, N = envs): `obs[t]` is the observation acted on at step t,
`next_obs` the one after the last step. Two things differ from CleanRL's file, both from Gymnasium 1.x's
NEXT_STEP autoreset: a step right after an episode ended is the reset step (its action is ignored), so
it is masked out (`valid` False); and a truncated episode bootstraps from its final observation, which
NEXT_STEP returns (GAE: delta_t = r_t + gamma (1 - terminated_t) V(s_t+1) - V(s_t), and the advantage
chain is cut where terminated or truncated).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from prl_actors.classic.envkit.policy import Agent

if TYPE_CHECKING:
    from prl_actors.classic.envkit.arrays import Array
    from prl_actors.classic.envkit.settings import PPOSection

STEP_KEYS = ("actions", "logprobs", "rewards", "terminated", "truncated", "valid")


@dataclass
class Rollout:
    obs: Array  # [T, N, *obs]
    actions: Array  # [T, N]
    logprobs: Array  # [T, N] under the acting policy
    rewards: Array  # [T, N]
    terminated: Array  # [T, N] bool
    truncated: Array  # [T, N] bool
    valid: Array  # [T, N] bool, False on autoreset steps
    next_obs: Array  # [N, *obs]

    @classmethod
    def concat(cls, parts: list[dict[str, Array]]) -> Rollout:
        """Segments of equal T side by side (env axis 1)."""
        cols = {k: np.concatenate([p[k] for p in parts], axis=1) for k in ("obs", *STEP_KEYS)}
        return cls(**cols, next_obs=np.concatenate([p["next_obs"] for p in parts], axis=0))


def gae(agent: Agent, ro: Rollout, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(advantages [T, N], returns [T, N], values [T, N]) with the current critic."""
    with torch.no_grad():
        t, n = ro.rewards.shape
        values = agent.get_value(torch.as_tensor(ro.obs, dtype=torch.float32)).reshape(t, n)
        last = agent.get_value(torch.as_tensor(ro.next_obs, dtype=torch.float32)).reshape(1, n)
        nxt = torch.cat([values[1:], last])  # V(s_t+1) [T, N]
        rewards = torch.as_tensor(ro.rewards, dtype=torch.float32)
        not_term = 1.0 - torch.as_tensor(ro.terminated, dtype=torch.float32)
        not_done = 1.0 - torch.as_tensor(ro.terminated | ro.truncated, dtype=torch.float32)
        delta = rewards + gamma * nxt * not_term - values
        adv = torch.zeros_like(values)
        running = torch.zeros(n)
        for step in reversed(range(t)):
            running = delta[step] + gamma * lam * not_done[step] * running
            adv[step] = running
    return adv, adv + values, values


def update(
    agent: Agent, opt: torch.optim.Optimizer, ro: Rollout, p: PPOSection, gen: torch.Generator
) -> dict[str, float]:
    """PPO epochs over the valid transitions of `ro`; returns CleanRL's logged losses."""
    adv, ret, val = gae(agent, ro, p.gamma, p.gae_lambda)
    mask = torch.as_tensor(ro.valid.reshape(-1))
    b_obs = torch.as_tensor(ro.obs, dtype=torch.float32).reshape(-1, *ro.obs.shape[2:])[mask]
    b_act = torch.as_tensor(ro.actions).reshape(-1)[mask]
    b_logp = torch.as_tensor(ro.logprobs, dtype=torch.float32).reshape(-1)[mask]
    b_adv, b_ret, b_val = adv.reshape(-1)[mask], ret.reshape(-1)[mask], val.reshape(-1)[mask]
    size = len(b_act)
    mb = max(1, size // p.num_minibatches)
    stats: dict[str, list[float]] = {k: [] for k in ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")}
    for _ in range(p.update_epochs):
        order = torch.randperm(size, generator=gen)
        for start in range(0, size, mb):
            idx = order[start : start + mb]
            _, newlogp, entropy, newv = agent.get_action_and_value(b_obs[idx], b_act[idx])
            logratio = newlogp - b_logp[idx]
            ratio = logratio.exp()
            with torch.no_grad():
                stats["approx_kl"].append(float(((ratio - 1) - logratio).mean()))
                stats["clipfrac"].append(float(((ratio - 1.0).abs() > p.clip_coef).float().mean()))
            a = b_adv[idx]
            if p.norm_adv and len(idx) > 1:
                a = (a - a.mean()) / (a.std() + 1e-8)
            pg = torch.max(-a * ratio, -a * torch.clamp(ratio, 1 - p.clip_coef, 1 + p.clip_coef)).mean()
            v_loss = _value_loss(newv.view(-1), b_ret[idx], b_val[idx], p)
            ent = entropy.mean()
            loss = pg - p.ent_coef * ent + v_loss * p.vf_coef
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), p.max_grad_norm)
            opt.step()
            stats["pg_loss"].append(float(pg.detach()))
            stats["v_loss"].append(float(v_loss.detach()))
            stats["entropy"].append(float(ent.detach()))
    return {k: float(np.mean(v)) for k, v in stats.items()} | {"transitions": float(size)}


def _value_loss(newv: torch.Tensor, ret: torch.Tensor, old: torch.Tensor, p: PPOSection) -> torch.Tensor:
    if not p.clip_vloss:
        return 0.5 * ((newv - ret) ** 2).mean()
    clipped = old + torch.clamp(newv - old, -p.clip_coef, p.clip_coef)
    return 0.5 * torch.max((newv - ret) ** 2, (clipped - ret) ** 2).mean()


def make_agent(env: Any, p: PPOSection, seed: int) -> tuple[Agent, torch.optim.Optimizer]:
    """CleanRL's agent and Adam (eps 1e-5) for a vector env's single spaces."""
    torch.manual_seed(seed)
    obs_dim = int(np.prod(env.single_observation_space.shape))
    agent = Agent(obs_dim, int(env.single_action_space.n), p.hidden)
    return agent, torch.optim.Adam(agent.parameters(), lr=p.learning_rate, eps=1e-5)


def anneal(opt: torch.optim.Optimizer, p: PPOSection, done_steps: int) -> None:
    if p.anneal_lr:
        frac = max(0.0, 1.0 - done_steps / p.total_timesteps)
        opt.param_groups[0]["lr"] = frac * p.learning_rate


class Returns:
    """The last `window` episode returns: the solved criterion (mean >= solved_return over a full window)."""

    def __init__(self, p: PPOSection) -> None:
        self.p = p
        self.window: deque[float] = deque(maxlen=p.solved_episodes)
        self.episodes = 0

    def add(self, returns: list[float]) -> None:
        self.window.extend(returns)
        self.episodes += len(returns)

    @property
    def mean(self) -> float:
        return float(np.mean(self.window)) if self.window else float("nan")

    @property
    def solved(self) -> bool:
        return len(self.window) == self.window.maxlen and self.mean >= self.p.solved_return


Row = Callable[[dict[str, Any]], None]


def collect(
    envs: Any, agent: Agent, next_obs: Array, steps: int, autoreset: Array, returns: Returns
) -> tuple[Rollout, Array, Array]:
    """CleanRL's rollout loop over a VectorEnv (wrapped in RecordEpisodeStatistics)."""
    n = envs.num_envs
    cols: dict[str, list[Array]] = {k: [] for k in ("obs", *STEP_KEYS)}
    for _ in range(steps):
        with torch.no_grad():
            action, logp, _, _ = agent.get_action_and_value(torch.as_tensor(next_obs, dtype=torch.float32))
        obs = next_obs
        next_obs, reward, term, trunc, infos = envs.step(action.numpy())
        row = (obs, action.numpy(), logp.numpy(), reward.astype(np.float32), term, trunc, ~autoreset)
        for key, value in zip(cols, row, strict=True):
            cols[key].append(value)
        autoreset = term | trunc
        if "_episode" in infos:
            returns.add([float(r) for r in infos["episode"]["r"][infos["_episode"]]])
    assert all(len(v) == steps for v in cols.values()) and n == next_obs.shape[0]
    return Rollout(**{k: np.stack(v) for k, v in cols.items()}, next_obs=next_obs), next_obs, autoreset


def train_vector(envs: Any, p: PPOSection, seed: int, emit: Row, log_every: int = 1) -> dict[str, Any]:
    """PPO against any NEXT_STEP VectorEnv until solved or `total_timesteps`; `emit` gets one row per update."""
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    envs = RecordEpisodeStatistics(envs)
    agent, opt = make_agent(envs, p, seed)
    gen = torch.Generator().manual_seed(seed)
    returns = Returns(p)
    next_obs, _ = envs.reset(seed=seed)
    autoreset = np.zeros(envs.num_envs, dtype=bool)
    t0, steps, update_no = time.monotonic(), 0, 0
    while steps < p.total_timesteps and not (p.stop_when_solved and returns.solved):
        anneal(opt, p, steps)
        ro, next_obs, autoreset = collect(envs, agent, next_obs, p.num_steps, autoreset, returns)
        steps += ro.rewards.size
        stats = update(agent, opt, ro, p, gen)
        update_no += 1
        emit(row(update_no, steps, t0, returns, stats))
    return result(update_no, steps, returns, t0) | {"agent": agent}


def result(updates: int, steps: int, returns: Returns, t0: float) -> dict[str, Any]:
    wall = time.monotonic() - t0
    return {"updates": updates, "steps": steps, "solved": returns.solved, "return_mean": returns.mean, "wall_s": wall}


def row(update_no: int, steps: int, t0: float, returns: Returns, stats: dict[str, float]) -> dict[str, Any]:
    wall = time.monotonic() - t0
    return {
        "update": update_no,
        "epoch": update_no - 1,
        "version": update_no,
        "global_step": steps,
        "wall_s": round(wall, 3),
        "sps": round(steps / max(wall, 1e-9), 1),
        "episodes": returns.episodes,
        "return_mean": round(returns.mean, 2) if returns.window else None,
        "solved": returns.solved,
        **{k: round(v, 6) for k, v in stats.items()},
    }


POLICY_FILE = "policy.pt"


def save_policy(path: Path, agent: Agent, env_id: str, hidden: int) -> Path:
    """The trained agent (actor and critic) as RUN_DIR/final/policy.pt: its state dict and what rebuilds it
    (`Agent(obs_dim, n_actions, hidden)`; load with torch.load(..., weights_only=True))."""
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in agent.state_dict().items()}
    obs_dim = int(state["critic.0.weight"].shape[1]) if "critic.0.weight" in state else -1
    n_actions = int([v for k, v in state.items() if k.startswith("actor") and k.endswith("weight")][-1].shape[0])
    meta = {"env_id": env_id, "obs_dim": obs_dim, "n_actions": n_actions, "hidden": hidden}
    torch.save({"state_dict": state, "meta": meta}, path / POLICY_FILE)
    return path / POLICY_FILE
