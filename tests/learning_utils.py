"""Helpers for the learning-plane tests: tiny configs, tiny models, rollouts as wire Groups."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from prl_actors.config import Config, load_config
from prl_actors.engines.base import GeneratedGroup
from prl_actors.launch import build
from prl_actors.protocol.messages import Group, Prompt, Sample


def tiny_config(**overrides: object) -> Config:
    """A small built-in-model config; `overrides` are dotted keys with '__' for '.'."""
    base: dict[str, object] = {
        "model.hidden_size": 32,
        "model.layers": 2,
        "model.heads": 4,
        "model.warm_start_steps": 30,  # enough for a peaked, non-uniform distribution
        "worker.group_size": 4,
        "worker.sampling.max_new_tokens": 5,
        "task.max_operand": 20,
    }
    base.update({k.replace("__", "."): v for k, v in overrides.items()})
    return load_config(None, base)


def tiny_model(run_dir: Path, **overrides: object) -> tuple[Config, Path]:
    cfg = tiny_config(**overrides)
    return cfg, build.model_dir(cfg, run_dir)


def to_group(gen: GeneratedGroup, reward: Callable[[str], float], worker: str = "w0") -> Group:
    """What a worker sends: the generated group with a reward per sample."""
    samples = [
        Sample(text=s.text, token_ids=s.token_ids, logprobs=s.logprobs, reward=reward(s.text), finished=s.finished)
        for s in gen.samples
    ]
    return Group(group_id=gen.group_id, prompt=gen.prompt, prompt_ids=gen.prompt_ids, samples=samples, worker=worker)


def random_rewards(groups: list[GeneratedGroup], seed: int = 0) -> list[Group]:
    """Groups with random 0/1 rewards (mixed within a group, so advantages are non-zero)."""
    rng = random.Random(seed)
    return [to_group(g, lambda _text: float(rng.random() < 0.5)) for g in groups]


def prompts(texts: list[str]) -> list[Prompt]:
    return [Prompt(group_id=i, prompt=t) for i, t in enumerate(texts)]
