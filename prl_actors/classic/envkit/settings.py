"""The `env` config section: classic RL through env actors (docs/ENVS.md). Present = a classic-RL run.

Kept apart from prl_actors/config.py (which embeds it as `Config.env`) so the env run's knobs live with
the code that reads them. Every field is validated; `load_config` turns mistakes into one-line errors.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from prl_actors.sections import Section


class PPOSection(Section):
    """CleanRL's ppo.py hyper-parameters (same names, same defaults unless said)."""

    total_timesteps: int = Field(500_000, ge=1, description="Env steps to train for at most.")
    num_steps: int = Field(128, ge=1, description="Steps per env per update (the segment length T).")
    learning_rate: float = Field(2.5e-4, gt=0, description="Adam learning rate.")
    anneal_lr: bool = Field(True, description="Anneal the learning rate linearly to 0 over the run.")
    gamma: float = Field(0.99, gt=0, le=1)
    gae_lambda: float = Field(0.95, ge=0, le=1)
    num_minibatches: int = Field(4, ge=1)
    update_epochs: int = Field(4, ge=1)
    norm_adv: bool = Field(True, description="Normalise advantages per minibatch.")
    clip_coef: float = Field(0.2, gt=0)
    clip_vloss: bool = Field(True)
    ent_coef: float = Field(0.01, ge=0)
    vf_coef: float = Field(0.5, ge=0)
    max_grad_norm: float = Field(0.5, gt=0)
    hidden: int = Field(64, ge=1, description="Width of the two hidden layers of actor and critic.")
    solved_return: float = Field(475.0, description="Solved: mean return over the last solved_episodes.")
    solved_episodes: int = Field(100, ge=1)
    stop_when_solved: bool = Field(True, description="End the run as soon as it is solved.")


class EnvSection(Section):
    env_id: str = Field("CartPole-v1", description="Gymnasium id (discrete actions, Box observations).")
    mode: Literal["acting", "remote"] = Field(
        "acting",
        description="acting: env actors act with a policy copy and stream segments (DETACH); remote: the "
        "learner's EnvClient (a VectorEnv) steps them with its actions.",
    )
    actors: int = Field(2, ge=0, description="Env actor processes `up` starts (more may join at runtime).")
    num_envs: int = Field(8, ge=1, description="Env slots of the run (the vector env's num_envs).")
    wait_actors_s: float = Field(10.0, ge=0, description="At start, wait this long for `actors` env actors.")
    step_timeout_s: float = Field(10.0, gt=0, description="An env actor silent on a request this long is lost.")
    call_timeout_s: float = Field(120.0, gt=0, description="A vector call that cannot finish this long fails.")
    learner_timeout_s: float = Field(60.0, gt=0, description="An env actor that hears nothing this long exits.")
    round_timeout_s: float = Field(
        120.0, gt=0, description="Acting: an env actor whose segment is this late is lost (its slots too)."
    )
    sync_kl_threshold: float = Field(
        0.0, ge=0, description="AAPS: fetch weights only when the KL estimate exceeds this (0 = always sync)."
    )
    kl_obs_per_env: int = Field(32, ge=1, description="AAPS: recent observations per env for the KL estimate.")
    threads: int = Field(1, ge=1, description="torch threads in the learner and each env actor.")
    ppo: PPOSection = PPOSection()

    @model_validator(mode="after")
    def _batch_divides(self) -> EnvSection:
        if self.num_envs * self.ppo.num_steps < self.ppo.num_minibatches:
            raise ValueError("num_envs x ppo.num_steps must be at least ppo.num_minibatches")
        return self
