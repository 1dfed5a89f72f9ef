"""Recipe options on the real learner: masks, checkpointing, schedules and reference sync across a
resume, LoRA with minibatches, and the shipped configs/recipes/*.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from msgspec.structs import replace

from prl_actors.config import Config, load_config
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.launch import build
from prl_actors.launch.topology import learner_settings
from prl_actors.protocol.messages import Group
from prl_actors.training.grpo import GRPOLearner
from tests.learning_utils import prompts, random_rewards, tiny_model

pytestmark = pytest.mark.fast

TEXTS = ["3+4=", "12+19=", "7+15=", "0+0="]
RECIPES = Path(__file__).resolve().parents[1] / "configs" / "recipes"


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path, list[Group]]:
    cfg, model_dir = tiny_model(tmp_path_factory.mktemp("recipes"), trainer__beta=0.05, trainer__lr=1e-2)
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    return cfg, model_dir, random_rewards(engine.generate(prompts(TEXTS), 4))


def learner_for(cfg: Config, model_dir: Path, **trainer: object) -> GRPOLearner:
    return GRPOLearner(
        learner_settings(cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update=trainer)})), model_dir
    )


def epoch(learner: GRPOLearner, groups: list[Group], e: int) -> dict[str, float]:
    learner.begin_epoch(e, len(groups))
    for g in groups:
        learner.accumulate(g)
    return learner.step()


def grads_of(learner: GRPOLearner, groups: list[Group]) -> dict[str, torch.Tensor]:
    """The summed (not yet normalised) gradient of one epoch's groups, nothing stepped."""
    learner.begin_epoch(0, len(groups))
    for g in groups:
        learner.accumulate(g)
    learner.flush()
    return {n: p.grad.detach().clone() for n, p in learner.policy.named_parameters() if p.grad is not None}


def test_truncated_samples_contribute_nothing(rollouts) -> None:
    """mask_truncated_completions: a group whose samples are all unfinished gives zero gradient
    (beta > 0 too: no KL term either); without the mask it trains."""
    cfg, model_dir, groups = rollouts
    cut = replace(
        groups[1], samples=[replace(s, finished=False, reward=float(i % 2)) for i, s in enumerate(groups[1].samples)]
    )
    masked = grads_of(learner_for(cfg, model_dir, mask_truncated_completions=True), [cut])
    assert masked and all(torch.equal(g, torch.zeros_like(g)) for g in masked.values())
    plain = grads_of(learner_for(cfg, model_dir), [cut])
    assert any(g.abs().max() > 0 for g in plain.values())


def test_gradient_checkpointing_gives_the_same_gradient(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    plain = grads_of(learner_for(cfg, model_dir), groups)
    ckpt_learner = learner_for(cfg, model_dir, gradient_checkpointing=True)
    assert any(getattr(m, "gradient_checkpointing", False) for m in ckpt_learner.policy.modules())
    ckpt = grads_of(ckpt_learner, groups)
    assert plain.keys() == ckpt.keys()
    for name in plain:
        assert torch.allclose(plain[name], ckpt[name], atol=1e-6, rtol=1e-5), name


def test_schedule_and_reference_sync_survive_a_resume(rollouts, tmp_path: Path) -> None:
    """Cosine lr with warm-up and a reference mixed every epoch: a learner resumed from epoch 2's
    checkpoint (with another run.epochs) trains epoch 3 exactly as the uninterrupted one."""
    cfg, model_dir, groups = rollouts
    options = {"lr_scheduler": "cosine", "warmup_epochs": 1, "ref_sync_epochs": 1, "ref_mixup_alpha": 0.5}
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"epochs": 4})})
    straight = learner_for(cfg, model_dir, **options)
    lrs = [epoch(straight, groups, e)["lr"] for e in range(2)]
    assert lrs == pytest.approx([1e-2 / 2, 1e-2])  # warm-up (e + 1) / (W + 1), then the cosine's start
    straight.save_checkpoint(tmp_path / "ckpt")
    longer = cfg.model_copy(update={"run": cfg.run.model_copy(update={"epochs": 40})})
    resumed = learner_for(longer, model_dir, **options)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.horizon == 4
    assert resumed.tri.reference is not None and straight.tri.reference is not None
    for a, b in zip(straight.tri.reference.parameters(), resumed.tri.reference.parameters(), strict=True):
        assert torch.equal(a, b)
    m1, m2 = epoch(straight, groups, 2), epoch(resumed, groups, 2)
    assert m1["lr"] == m2["lr"] == pytest.approx(1e-2 * 0.5 * (1 + torch.cos(torch.tensor(torch.pi / 3)).item()))
    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_reference_sync_mixes_the_policy_in(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    learner = learner_for(cfg, model_dir, ref_sync_epochs=2, ref_mixup_alpha=0.25)
    ref = learner.tri.reference
    assert ref is not None
    initial = [p.detach().clone() for p in ref.parameters()]
    epoch(learner, groups, 0)
    assert all(torch.equal(a, b) for a, b in zip(initial, ref.parameters(), strict=True))  # not yet: every 2
    epoch(learner, groups, 1)
    for r0, r, p in zip(initial, ref.parameters(), learner.policy.parameters(), strict=True):
        assert torch.allclose(r, 0.75 * r0 + 0.25 * p.detach(), atol=1e-7)


def test_lora_with_minibatches_steps_the_adapter(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    cfg = load_config(None, {**flat(cfg), "trainer.lora": {"r": 4, "alpha": 8}})
    learner = learner_for(cfg, model_dir, num_minibatches=2, num_iterations=2)
    before = {n: p.detach().clone() for n, p in learner.policy.named_parameters() if p.requires_grad}
    metrics = epoch(learner, groups, 0)
    assert metrics["optimizer_steps"] == 4 and learner.version == 1
    after = dict(learner.policy.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)


def flat(cfg: Config) -> dict[str, object]:
    from prl_actors.config import leaves

    return {k: v for k, v in leaves(cfg.model_dump(mode="json")).items() if v is not None}


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES.glob("*.yaml")))
def test_each_recipe_loads_and_trains_two_epochs(rollouts, recipe: str) -> None:
    """Every shipped recipe is a valid config whose trainer section trains (the tiny model's sizes)."""
    cfg, model_dir, groups = rollouts
    shipped = load_config(RECIPES / f"{recipe}.yaml")
    trainer = shipped.trainer.model_copy(update={"num_minibatches": min(shipped.trainer.num_minibatches, len(groups))})
    learner = GRPOLearner(learner_settings(cfg.model_copy(update={"trainer": trainer})), model_dir)
    for e in range(2):
        metrics = epoch(learner, groups, e)
        assert metrics["optimizer_steps"] == trainer.num_minibatches * trainer.num_iterations
    assert learner.version == 2
