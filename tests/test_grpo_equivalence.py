"""Arrival order and micro-batching do not change the update (the periodic == sync invariant)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from prl_actors.config import Config
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.protocol.messages import Group
from prl_actors.training.grpo import GRPOLearner
from tests.learning_utils import prompts, random_rewards, tiny_model

TEXTS = ["3+4=", "12+19=", "7+15=", "0+0=", "20+1=", "9+9="]


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path, list[Group]]:
    cfg, model_dir = tiny_model(tmp_path_factory.mktemp("grpo"), trainer__beta=0.05)
    engine = TorchEngine(cfg, model_dir)
    engine.version = 0
    return cfg, model_dir, random_rewards(engine.generate(prompts(TEXTS), 4))


def in_dtype(cfg: Config, dtype: str) -> Config:
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": dtype})})


def train_once(cfg: Config, model_dir: Path, groups: list[Group], **trainer: object) -> GRPOLearner:
    cfg = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update=trainer)})
    learner = GRPOLearner(cfg, model_dir)
    learner.begin_epoch(0, len(groups))
    for g in groups:
        learner.accumulate(g)
    learner.step()
    return learner


def assert_same_weights(a: GRPOLearner, b: GRPOLearner, atol: float) -> None:
    wa, wb = a.weights(), b.weights()
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.allclose(wa[name], wb[name], atol=atol, rtol=0), name


@pytest.mark.parametrize(("dtype", "atol"), [("float64", 1e-9), ("float32", 1e-5)])
def test_arrival_order_and_micro_batches_give_the_same_weights(rollouts, dtype: str, atol: float) -> None:
    """Exact in float64. In float32 only summation-order rounding differs; AdamW's first step,
    g / (|g| + 1e-8), can magnify it for near-zero gradient entries to a few 1e-6."""
    cfg, model_dir, groups = rollouts
    cfg = in_dtype(cfg, dtype)
    shuffled = groups[:]
    random.Random(1).shuffle(shuffled)
    assert shuffled != groups
    in_order = train_once(cfg, model_dir, groups, micro_batch_groups=1)
    reordered = train_once(cfg, model_dir, shuffled, micro_batch_groups=1)
    one_batch = train_once(cfg, model_dir, groups, micro_batch_groups=len(groups))
    pairs = train_once(cfg, model_dir, shuffled, micro_batch_groups=4)  # 4 + a partial 2 flushed by step
    initial = GRPOLearner(cfg, model_dir).weights()
    assert any(not torch.equal(initial[k], v) for k, v in in_order.weights().items())  # it did learn
    for other in (reordered, one_batch, pairs):
        assert_same_weights(in_order, other, atol=atol)


def test_packed_and_unpacked_layouts_give_the_same_weights(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    packed = train_once(cfg, model_dir, groups, shared_prompt=True)
    unpacked = train_once(cfg, model_dir, groups, shared_prompt=False)
    assert_same_weights(packed, unpacked, atol=1e-5)


def test_step_metrics_and_version(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    learner = GRPOLearner(cfg, model_dir)
    learner.begin_epoch(0, len(groups))
    stats = learner.accumulate(groups[0])
    assert stats["tokens"] == sum(len(s.token_ids) for s in groups[0].samples)
    for g in groups[1:]:
        learner.accumulate(g)
    metrics = learner.step()
    rewards = [s.reward for g in groups for s in g.samples]
    assert learner.version == 1 and metrics["version"] == 1
    assert metrics["reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
    assert metrics["accuracy"] == pytest.approx(sum(r >= 1 for r in rewards) / len(rewards))
    assert metrics["samples"] == len(rewards)
    assert metrics["tokens"] == sum(len(s.token_ids) for g in groups for s in g.samples)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-7)  # policy == reference before the first step
    assert metrics["clip_frac"] == 0.0  # strict on-policy: ratio == 1
    assert metrics["grad_norm"] > 0
    for key in ("loss", "response_len", "groups"):
        assert key in metrics


def test_second_epoch_has_kl_and_versions_count_up(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    learner = train_once(cfg, model_dir, groups)
    learner.begin_epoch(1, len(groups))
    for g in groups:
        learner.accumulate(g)
    metrics = learner.step()
    assert learner.version == 2
    assert metrics["kl"] > 0


def test_checkpoint_round_trip(rollouts, tmp_path: Path) -> None:
    cfg, model_dir, groups = rollouts
    learner = train_once(cfg, model_dir, groups)
    learner.save_checkpoint(tmp_path / "ckpt")
    restored = GRPOLearner(cfg, model_dir)
    restored.load_checkpoint(tmp_path / "ckpt")
    assert restored.version == 1
    assert_same_weights(learner, restored, atol=0)
    for lrn in (learner, restored):  # the optimizer state came back too: the next step agrees
        lrn.begin_epoch(1, len(groups))
        for g in groups:
            lrn.accumulate(g)
        lrn.step()
    assert_same_weights(learner, restored, atol=1e-6)
    assert (tmp_path / "ckpt" / "model" / "tokenizer.json").is_file()


def test_incomplete_checkpoint_is_refused(rollouts, tmp_path: Path) -> None:
    cfg, model_dir, _ = rollouts
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        GRPOLearner(cfg, model_dir).load_checkpoint(tmp_path)
