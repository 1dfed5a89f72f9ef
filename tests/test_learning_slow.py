"""GRPO really learns: generation (TorchEngine) + learning (GRPOLearner), no actors, on `add`.

The demo hyper-parameters: the built-in model with its default warm start, 20 epochs of 32 groups
x G=8 samples at temperature 1, lr 1e-3. The mean reward of the last 3 epochs must clearly exceed
that of the first 3.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from prl_actors.config import load_config
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.launch import build
from prl_actors.launch.topology import learner_settings
from prl_actors.training.grpo import GRPOLearner
from tests.learning_utils import to_group

DEMO = {
    "coordinator.groups_per_epoch": 32,
    "worker.group_size": 8,
    "worker.sampling.temperature": 1.0,
    "worker.sampling.max_new_tokens": 4,
    "trainer.lr": 1e-3,
}
EPOCHS = 20


@pytest.mark.slow
def test_grpo_raises_the_reward_on_add(tmp_path: Path) -> None:
    cfg = load_config(None, DEMO)
    started = time.monotonic()
    model_dir = build.model_dir(cfg, tmp_path)
    print(f"\nmodel prepared in {time.monotonic() - started:.1f}s")
    engine, learner, task = (
        TorchEngine(build.engine_settings(cfg), model_dir),
        GRPOLearner(learner_settings(cfg), model_dir),
        build.task(cfg),
    )
    curve = []
    for epoch in range(EPOCHS):
        t0 = time.monotonic()
        engine.load_weights(learner.version, learner.weights())
        batch = task.prompts_for_epoch(epoch, cfg.coordinator.groups_per_epoch)
        generated = engine.generate(batch, cfg.worker.group_size)
        learner.begin_epoch(epoch, len(batch))
        for prompt, gen in zip(batch, generated, strict=True):
            learner.accumulate(to_group(gen, lambda text, p=prompt: task.score(p, text)))
        metrics = learner.step()
        curve.append(metrics["reward_mean"])
        print(
            f"epoch {epoch:2d} reward {metrics['reward_mean']:.3f} len {metrics['response_len']:.2f} "
            f"grad_norm {metrics['grad_norm']:.2f} {time.monotonic() - t0:.2f}s"
        )
    first, last = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
    print(f"first 3 epochs {first:.3f} -> last 3 epochs {last:.3f}; total {time.monotonic() - started:.1f}s")
    assert last >= first + 0.15


RECIPES = Path(__file__).resolve().parents[1] / "configs" / "recipes"


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES.glob("*.yaml")))
def test_each_recipe_raises_the_reward_on_add(tmp_path: Path, recipe: str) -> None:
    """The shipped recipe (its trainer section, its B and G) on the built-in task, generation and
    learning in one process: the reward of the last 3 epochs clearly exceeds that of the first 3."""
    cfg = load_config(RECIPES / f"{recipe}.yaml")
    model_dir = build.model_dir(cfg, tmp_path)
    engine, learner, task = (
        TorchEngine(build.engine_settings(cfg), model_dir),
        GRPOLearner(learner_settings(cfg), model_dir),
        build.task(cfg),
    )
    curve = []
    for epoch in range(EPOCHS):
        engine.load_weights(learner.version, learner.weights())
        batch = task.prompts_for_epoch(epoch, cfg.coordinator.groups_per_epoch)
        generated = engine.generate(batch, cfg.worker.group_size)
        learner.begin_epoch(epoch, len(batch))
        for prompt, gen in zip(batch, generated, strict=True):
            learner.accumulate(to_group(gen, lambda text, p=prompt: task.score(p, text)))
        metrics = learner.step()
        curve.append(metrics["reward_mean"])
        print(
            f"{recipe} epoch {epoch:2d} reward {metrics['reward_mean']:.3f} clip_frac {metrics['clip_frac']:.3f} "
            f"ratio [{metrics['ratio_min']:.3f}, {metrics['ratio_max']:.3f}] steps {metrics['optimizer_steps']:.0f}"
        )
    first, last = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
    print(f"{recipe}: first 3 epochs {first:.3f} -> last 3 epochs {last:.3f}")
    assert last >= first + 0.15
