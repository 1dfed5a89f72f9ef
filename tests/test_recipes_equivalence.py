"""periodic == sync for every recipe option: loss_type x scale_rewards, M minibatches, mu passes.

"sync" feeds the epoch's groups in group-index order and steps; "periodic" feeds them in a shuffled
arrival order with the trainer's early flushes between arrivals (trainer/core.py). Both must end at
the same float32 weights (minibatches by group index, old policy = frozen epoch-start weights).
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
import torch
from msgspec.structs import replace

from prl_actors.config import Config
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.launch import build
from prl_actors.launch.topology import learner_settings
from prl_actors.protocol.messages import Group
from prl_actors.training import minibatch
from prl_actors.training.grpo import GRPOLearner
from tests.learning_utils import prompts, random_rewards, tiny_model

pytestmark = pytest.mark.fast

TEXTS = ["3+4=", "12+19=", "7+15=", "0+0=", "20+1=", "9+9=", "5+11=", "2+2="]
LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo", "gspo", "cispo")
SCALES = ("group", "batch", "none")
SPLITS = [(m, mu) for m in (1, 2, 4) for mu in (1, 2)]
ATOL = 1e-4  # the loosest (float32) bound; an arrival-order split misses by 0.04 (asserted below)
TOLERANCE = {"float64": 1e-10, "float32": 1e-4}
"""float64: measured <= 1e-13, pure summation order. float32: measured <= 5e-5 against steps of
lr = 1e-2: reordered float32 sums differ in the last bits, and AdamW's early steps, m / (sqrt(v) +
1e-8), turn a near-zero gradient entry's rounding into a sizeable share of lr (see
test_grpo_equivalence.py); 1e-4 is 1% of one step and 400x below the arrival-order split's error."""


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path, list[Group]]:
    cfg, model_dir = tiny_model(
        tmp_path_factory.mktemp("recipes"),
        trainer__beta=0.05,
        trainer__lr=1e-2,
        trainer__eps_low=0.02,
        trainer__eps_high=0.03,
        coordinator__groups_per_epoch=len(TEXTS),
        worker__sampling__max_new_tokens=4,
    )
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    groups = random_rewards(engine.generate(prompts(TEXTS), 4))
    groups[0].samples = [replace(s, reward=0.5 + 0.1 * i) for i, s in enumerate(groups[0].samples)]
    assert any(not s.finished for g in groups for s in g.samples)  # mask_truncated_completions has work
    return cfg, model_dir, groups


def learner_for(cfg: Config, model_dir: Path, **trainer: object) -> GRPOLearner:
    return GRPOLearner(
        learner_settings(cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update=trainer)})), model_dir
    )


def sync_epoch(learner: GRPOLearner, groups: list[Group], epoch: int = 0) -> dict[str, float]:
    learner.begin_epoch(epoch, len(groups))
    for g in groups:
        learner.accumulate(g)
    return learner.step()


def periodic_epoch(learner: GRPOLearner, groups: list[Group], seed: int, epoch: int = 0) -> dict[str, float]:
    """Shuffled arrival; after some arrivals the trainer's idle flush (of at most 2 groups)."""
    rng = random.Random(seed)
    order = groups[:]
    rng.shuffle(order)
    learner.begin_epoch(epoch, len(groups))
    for g in order:
        learner.accumulate(g)
        if rng.random() < 0.5:
            learner.flush(rng.choice([None, 1, 2]))
    return learner.step()


def master(learner: GRPOLearner) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in learner.policy.state_dict().items()}


def max_diff(a: GRPOLearner, b: GRPOLearner) -> float:
    wa, wb = master(a), master(b)
    return max((wa[k].double() - wb[k].double()).abs().max().item() for k in wa)


def both(cfg: Config, model_dir: Path, groups: list[Group], **trainer: object) -> tuple[GRPOLearner, GRPOLearner]:
    sync, periodic = learner_for(cfg, model_dir, **trainer), learner_for(cfg, model_dir, **trainer)
    sync_epoch(sync, groups)
    periodic_epoch(periodic, groups, seed=len(str(trainer)))
    return sync, periodic


CASES = [
    (loss, scale, *SPLITS[i % len(SPLITS)]) for i, (loss, scale) in enumerate(itertools.product(LOSS_TYPES, SCALES))
] + [("dapo", "group", m, mu) for m, mu in SPLITS]


def in_dtype(cfg: Config, dtype: str) -> Config:
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": dtype})})


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("loss_type", "scale", "m", "mu"), CASES)
def test_periodic_equals_sync(rollouts, loss_type: str, scale: str, m: int, mu: int, dtype: str) -> None:
    """Every loss_type x scale_rewards pair (each with one of the six (M, mu) splits, in turn), and
    every (M, mu) with the default loss; micro-batches of any size."""
    cfg, model_dir, groups = rollouts
    cfg = in_dtype(cfg, dtype)
    options = {"loss_type": loss_type, "scale_rewards": scale, "num_minibatches": m, "num_iterations": mu}
    sync, periodic = both(cfg, model_dir, groups, mask_truncated_completions=(m + mu) % 2 == 0, **options)
    initial = learner_for(cfg, model_dir)
    assert max_diff(sync, initial) > 50 * ATOL  # it learned (about lr per step), far beyond the tolerance
    assert max_diff(sync, periodic) < TOLERANCE[dtype]
    assert sync.version == periodic.version == 1  # one published version, whatever M x mu


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "options",
    [
        {"kl_estimator": "k1", "entropy_coef": 0.01, "delta": 1.5},
        {"kl_estimator": "k2", "weight_decay": 0.1, "lr_scheduler": "cosine", "warmup_epochs": 1},
        {"importance_sampling_level": "sequence", "loss_type": "dr_grpo", "ref_sync_epochs": 1},
    ],
)
def test_regularisers_keep_periodic_equal_to_sync(rollouts, options: dict[str, object], dtype: str) -> None:
    """Two epochs (the second from moved weights, against a moved reference where ref_sync is on)."""
    cfg, model_dir, groups = rollouts
    cfg = in_dtype(cfg, dtype)
    trainer = {"num_minibatches": 2, "num_iterations": 2, **options}
    sync, periodic = learner_for(cfg, model_dir, **trainer), learner_for(cfg, model_dir, **trainer)
    for epoch in range(2):
        sync_epoch(sync, groups, epoch)
        periodic_epoch(periodic, groups, seed=epoch, epoch=epoch)
    assert max_diff(sync, learner_for(cfg, model_dir)) > 50 * ATOL
    assert max_diff(sync, periodic) < TOLERANCE[dtype]


@pytest.mark.parametrize("loss_type", ["dapo", "gspo"])
def test_bfloat16_minibatches_keep_periodic_equal_to_sync(rollouts, loss_type: str) -> None:
    """bfloat16 compute on the float32 master, 2 minibatches x 2 passes, groups trained one by one.
    The minibatches arrive interleaved (a group of minibatch 1 before minibatch 0 is complete: held
    until the first step), each in the same order as in sync, so the float32 sums are the same and
    the weights must be equal. (Arrival order *within* a minibatch only changes float summation order,
    but in bfloat16 that is not a tolerance one can state after several steps: noise of 1e-7 of a
    gradient at the first step changes the master weights by up to 2e-2 four steps later, because the
    next forwards cast the moved weights to bfloat16 and Adam normalises the difference; measured on
    this fixture with 12 seeds, sync against itself. The next test covers that order on one step.)"""
    cfg, model_dir, groups = rollouts
    cfg = in_dtype(cfg, "bfloat16")
    trainer = {"loss_type": loss_type, "num_minibatches": 2, "num_iterations": 2, "micro_batch_groups": 1}
    sync, periodic = learner_for(cfg, model_dir, **trainer), learner_for(cfg, model_dir, **trainer)
    sync_epoch(sync, groups)
    first = [g for g in groups if g.group_id * 2 // len(groups) == 0]
    second = [g for g in groups if g.group_id * 2 // len(groups) == 1]
    order = [g for pair in itertools.zip_longest(second, first) for g in pair if g is not None]
    assert order[0] in second  # minibatch 1 starts arriving first
    periodic.begin_epoch(0, len(groups))
    for g in order:
        periodic.accumulate(g)
    periodic.step()
    assert {p.dtype for p in sync.policy.parameters()} == {torch.float32}
    assert max_diff(sync, learner_for(cfg, model_dir)) > 50 * ATOL  # it learned
    assert max_diff(sync, periodic) < 1e-7


@pytest.mark.parametrize("loss_type", ["dapo", "gspo"])
def test_bfloat16_arrival_order_changes_only_float_summation(rollouts, loss_type: str) -> None:
    """bfloat16 compute, one optimizer step, groups in shuffled arrival order: float32 tolerance."""
    cfg, model_dir, groups = rollouts
    cfg = in_dtype(cfg, "bfloat16")
    trainer = {"loss_type": loss_type, "micro_batch_groups": 1}
    sync, periodic = learner_for(cfg, model_dir, **trainer), learner_for(cfg, model_dir, **trainer)
    sync_epoch(sync, groups)
    order = groups[:]
    random.Random(3).shuffle(order)
    periodic.begin_epoch(0, len(groups))
    for g in order:
        periodic.accumulate(g)
    periodic.step()
    assert max_diff(sync, learner_for(cfg, model_dir)) > 50 * ATOL
    assert max_diff(sync, periodic) < 1e-5


def test_minibatch_steps_move_the_ratio_and_clip(rollouts) -> None:
    """M = 2, mu = 2: four optimizer steps; after the first, old log-probs are the epoch-start
    policy's, so the ratio departs from 1 and the (tight) clip range acts."""
    cfg, model_dir, groups = rollouts
    learner = learner_for(cfg, model_dir, num_minibatches=2, num_iterations=2)
    metrics = sync_epoch(learner, groups)
    assert metrics["optimizer_steps"] == 4 and learner.version == 1
    assert metrics["clip_frac"] > 0
    assert metrics["ratio_min"] < 1 < metrics["ratio_max"]
    one = sync_epoch(learner_for(cfg, model_dir), groups)
    assert one["optimizer_steps"] == 1 and one["clip_frac"] == 0 and one["ratio_min"] == one["ratio_max"] == 1


def test_a_minibatch_steps_as_soon_as_its_groups_are_in(rollouts) -> None:
    """M = 2: groups 0..3 make minibatch 0. It steps when its last group arrives; a group of
    minibatch 1 arriving earlier waits (held, not queued, not trained)."""
    cfg, model_dir, groups = rollouts
    learner = learner_for(cfg, model_dir, num_minibatches=2, micro_batch_groups=1)
    learner.begin_epoch(0, len(groups))
    learner.accumulate(groups[5])
    assert learner.pending == 0 and learner.stats.trained_tokens == 0  # minibatch 1: waits
    for g in groups[:3]:
        learner.accumulate(g)
    assert learner.epoch_steps == 0
    learner.accumulate(groups[3])
    assert learner.epoch_steps == 1  # minibatch 0 stepped; group 5 is trained now, at the new weights
    assert learner.stats.groups == 5


def test_scale_rewards_batch_trains_nothing_before_every_group_is_in(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    learner = learner_for(cfg, model_dir, scale_rewards="batch", micro_batch_groups=1)
    learner.begin_epoch(0, len(groups))
    for g in groups[:-1]:
        learner.accumulate(g)
        learner.flush()
    assert learner.stats.trained_tokens == 0
    learner.accumulate(groups[-1])
    assert learner.stats.trained_tokens > 0


def test_a_split_by_arrival_order_breaks_the_equality(rollouts, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above is sensitive: minibatches cut by arrival order (not group index) give other
    weights in periodic than in sync (measured ~1e-3 against ATOL 2e-6)."""
    cfg, model_dir, groups = rollouts
    arrivals: list[int] = []

    def by_arrival(self: minibatch.EpochRun, group_id: int, group: object) -> int:  # type: ignore[type-arg]
        k = len(arrivals) * self.plan.minibatches // self.plan.groups
        arrivals.append(group_id)
        self.held[k].append(group)
        self.arrived += 1
        return k

    monkeypatch.setattr(minibatch.EpochRun, "add", by_arrival)
    cfg = in_dtype(cfg, "float64")
    sync = learner_for(cfg, model_dir, num_minibatches=2)
    sync_epoch(sync, groups)
    arrivals.clear()
    periodic = learner_for(cfg, model_dir, num_minibatches=2)
    periodic_epoch(periodic, groups, seed=0)
    assert max_diff(sync, periodic) > 100 * ATOL


def test_the_old_policy_is_the_epoch_start_policy_not_the_last_step(rollouts) -> None:
    """M = 2, mu = 1: minibatch 1 is trained once, after minibatch 0 stepped. Its old log-probs are
    the frozen epoch-start policy's, so its ratio is not 1 (an old policy refreshed at every step
    would give exactly 1 here)."""
    cfg, model_dir, groups = rollouts
    metrics = sync_epoch(learner_for(cfg, model_dir, num_minibatches=2), groups)
    assert metrics["optimizer_steps"] == 2
    assert metrics["ratio_max"] > 1.0 + 1e-3 and metrics["ratio_min"] < 1.0 - 1e-3
