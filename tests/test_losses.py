"""GRPO maths against hand-computed numbers."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from prl_actors.config import load_config
from prl_actors.launch import build
from prl_actors.sections import ConfigError
from prl_actors.training.losses import (
    ADV_EPS,
    batch_reward_std,
    cispo_loss,
    clip_sides,
    entropy,
    group_advantages,
    k3_kl,
    kl_estimate,
    log_ratio,
    normaliser,
    ppo_clip_loss,
    scaled_advantages,
    token_weights,
)
from prl_actors.training.minibatch import MinibatchPlan, lr_factor

pytestmark = pytest.mark.fast


def test_advantages_use_population_std() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    # mean 0.5, population std 0.5
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64) / (0.5 + ADV_EPS)
    assert torch.allclose(adv, expected, rtol=1e-12, atol=0)


def test_advantages_uneven_group() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    std = math.sqrt(0.25 * 0.75)  # Bernoulli(0.25) population std
    assert adv[0].item() == pytest.approx(0.75 / (std + ADV_EPS), rel=1e-12)
    assert adv[1].item() == pytest.approx(-0.25 / (std + ADV_EPS), rel=1e-12)
    assert adv.sum().item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(
    "rewards",
    [[1.0, 1.0, 1.0], [0.0, 0.0], [0.3], [0.9] * 6, [1 / 3] * 8, [0.1] * 7, [-2.7] * 5, [1e6 + 0.1] * 4],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equal_rewards_give_exactly_zero_advantages(rewards: list[float], dtype: torch.dtype) -> None:
    """0.9 x 6 and 1/3 x 8 used to give |A| up to 0.056 and 0.029: mean(r) - r_i is not exactly 0 in
    float, and dividing that residue by a std of the same size made it an advantage."""
    adv = group_advantages(torch.tensor(rewards, dtype=dtype))
    assert adv.shape == (len(rewards),)
    assert torch.equal(adv, torch.zeros(len(rewards), dtype=adv.dtype))


def reference_advantages(rewards: list[float]) -> list[float]:
    """The documented formula, written out in plain float64 Python."""
    if all(r == rewards[0] for r in rewards):
        return [0.0] * len(rewards)
    mean = math.fsum(rewards) / len(rewards)
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + ADV_EPS) for r in rewards]


def test_partial_credit_plugin_rewards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `task.reward` plugin returning fractional credit, random per sample for some prompts and
    the same for every sample of others: equal groups get exact zeros, the rest zero mean and unit
    population std (up to the 1e-6 in the denominator)."""
    (tmp_path / "partial_credit.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, {"task.reward": "partial_credit:credit"})
    task = build.task(cfg)
    rng = random.Random(0)
    equal_groups = 0
    for prompt in task.prompts_for_epoch(0, 40):
        responses = [str(rng.randrange(100)) for _ in range(8)]
        rewards = [task.score(prompt, r) for r in responses]
        adv = group_advantages(torch.tensor(rewards, dtype=torch.float64))
        if len(set(rewards)) == 1:
            equal_groups += 1
            assert torch.equal(adv, torch.zeros(8, dtype=torch.float64)), rewards
            continue
        assert adv.tolist() == pytest.approx(reference_advantages(rewards), rel=1e-12, abs=1e-12)
        assert float(adv.mean()) == pytest.approx(0.0, abs=1e-12)
        std = float(adv.std(correction=0))
        assert std == pytest.approx(1.0, abs=1e-5) and std < 1.0  # std / (std + 1e-6)
    assert 5 <= equal_groups <= 35  # both kinds of group were exercised


PLUGIN = """
import random, zlib

def credit(prompt: str, response: str, answer: str) -> float:
    key = zlib.crc32(prompt.encode())
    if key % 2:  # same fractional credit for every response to this prompt
        return [0.9, 1 / 3, 0.1, 0.7][key % 4]
    return random.Random(f"{prompt}|{response}").choice([0.0, 0.1, 0.25, 1 / 3, 0.5, 0.9, 1.0])
"""


def test_ppo_clip_hand_computed() -> None:
    old = torch.zeros(4)
    logp = torch.tensor([0.5, math.log(0.5), math.log(0.5), 0.5])  # ratios e^0.5, 0.5, 0.5, e^0.5
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, clipped = ppo_clip_loss(logp, old, adv, eps_low=0.2, eps_high=0.2)
    r = math.exp(0.5)
    # A>0: min(r, 1.2) = 1.2 (clipped); min(0.5, 0.8) = 0.5 (not clipped)
    # A<0: min(-0.5, -0.8) = -0.8 (clipped); min(-r, -1.2) = -r (not clipped)
    assert torch.allclose(loss, torch.tensor([-1.2, -0.5, 0.8, r]))
    assert clipped.tolist() == [True, False, True, False]


def test_ppo_clip_asymmetric_bounds() -> None:
    logp = torch.tensor([math.log(1.25), math.log(0.7)])
    loss, clipped = ppo_clip_loss(logp, torch.zeros(2), torch.tensor([1.0, -1.0]), eps_low=0.2, eps_high=0.28)
    assert torch.allclose(loss, torch.tensor([-1.25, 0.8]))  # 1.25 < 1.28 not clipped; 0.7 -> 0.8 clipped
    assert clipped.tolist() == [False, True]


def test_clip_sides_count_the_low_and_the_high_side_by_the_advantage_s_sign() -> None:
    """As TRL's clip_ratio/low_mean and high_mean: low = ratio < 1 - eps_low with A < 0, high = ratio >
    1 + eps_high with A > 0. Asymmetric eps (0.2 / 0.28), so swapping them, swapping the sides or
    dropping the sign condition each changes the answer."""
    ratio = torch.tensor([0.5, 0.5, 1.5, 1.5, 0.79, 1.25, 0.5, 1.5])
    adv = torch.tensor([-1.0, 1.0, 1.0, -1.0, -0.5, 2.0, 0.0, 0.0])
    low, high = clip_sides(ratio, adv, eps_low=0.2, eps_high=0.28)
    assert low.tolist() == [True, False, False, False, True, False, False, False]
    assert high.tolist() == [False, False, True, False, False, False, False, False]
    logp = ratio.log()
    _, clipped = ppo_clip_loss(logp, torch.zeros(8), adv, eps_low=0.2, eps_high=0.28)
    assert torch.equal(clipped, low | high)  # the PPO clip is active exactly on the two sides


def test_on_policy_gradient_is_minus_advantage() -> None:
    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    adv = torch.tensor([2.0, -1.0, 0.5])
    loss, clipped = ppo_clip_loss(logp, logp.detach(), adv, 0.2, 0.2)
    loss.sum().backward()
    assert torch.allclose(loss, -adv)  # ratio == 1
    assert logp.grad is not None and torch.allclose(logp.grad, -adv)
    assert not clipped.any()


def test_k3_kl_hand_computed() -> None:
    logp = torch.tensor([math.log(0.5), math.log(0.3)])
    ref = torch.tensor([math.log(0.25), math.log(0.3)])
    kl = k3_kl(logp, ref)
    # ref/p - log(ref/p) - 1 = 0.5 + ln 2 - 1, and 0 where equal
    assert kl[0].item() == pytest.approx(0.5 + math.log(2) - 1)
    assert kl[1].item() == pytest.approx(0.0)
    assert (k3_kl(torch.randn(100), torch.randn(100)) >= 0).all()


# --- the GRPO family (loss_type, scale_rewards, estimators) against hand-computed numbers ---------


def test_scale_rewards_group_none_batch() -> None:
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert torch.equal(scaled_advantages(r, "none"), torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64))
    assert torch.equal(scaled_advantages(r, "group"), group_advantages(r))
    std = batch_reward_std([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # 6 ones, 2 zeros: sqrt(0.75 * 0.25)
    assert std == pytest.approx(math.sqrt(0.1875), rel=1e-12)
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64) / (math.sqrt(0.1875) + ADV_EPS)
    assert torch.allclose(scaled_advantages(r, "batch", std), expected, rtol=1e-12, atol=0)
    assert torch.equal(scaled_advantages(torch.tensor([0.9] * 3), "batch", std), torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="epoch's reward std"):
        scaled_advantages(r, "batch")


def test_token_weights_and_normalisers() -> None:
    """Two samples of 3 and 1 tokens; the second is masked (truncated)."""
    index = torch.tensor([0, 0, 0, 1])
    keep = torch.tensor([True, True, True, False])
    assert token_weights("dapo", keep, index, 2).tolist() == [1.0, 1.0, 1.0, 0.0]
    assert token_weights("grpo", keep, index, 2).tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0])
    assert token_weights("gspo", torch.ones(4, dtype=torch.bool), index, 2).tolist() == pytest.approx(
        [1 / 3, 1 / 3, 1 / 3, 1.0]
    )
    assert normaliser("dapo", tokens=3, sequences=1, samples=2, max_new_tokens=8) == 3
    assert normaliser("bnpo", tokens=3, sequences=1, samples=2, max_new_tokens=8) == 3
    assert normaliser("cispo", tokens=3, sequences=1, samples=2, max_new_tokens=8) == 3
    assert normaliser("grpo", tokens=3, sequences=1, samples=2, max_new_tokens=8) == 1
    assert normaliser("dr_grpo", tokens=3, sequences=1, samples=2, max_new_tokens=8) == 16
    assert normaliser("dapo", tokens=0, sequences=0, samples=0, max_new_tokens=8) == 1  # never 0


def test_grpo_loss_is_the_mean_of_sequence_means() -> None:
    """Per-token losses [1, 2, 3 | 10]: grpo = ((1+2+3)/3 + 10/1) / 2 = 6; dapo = 16 / 4 = 4;
    dr_grpo with max_new_tokens 4 = 16 / (2 x 4) = 2."""
    loss = torch.tensor([1.0, 2.0, 3.0, 10.0], dtype=torch.float64)
    index, keep = torch.tensor([0, 0, 0, 1]), torch.ones(4, dtype=torch.bool)
    for kind, want in (("grpo", 6.0), ("dapo", 4.0), ("dr_grpo", 2.0)):
        total = float((token_weights(kind, keep, index, 2) * loss).sum())
        assert total / normaliser(kind, tokens=4, sequences=2, samples=2, max_new_tokens=4) == pytest.approx(want)


def test_sequence_ratio_is_the_geometric_mean_per_sequence() -> None:
    """GSPO: s_i = exp(mean_t (logp - old)) for every token of sample i."""
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    old = torch.tensor([-1.2, -1.6, -0.5], dtype=torch.float64)
    index = torch.tensor([0, 0, 1])
    seq = log_ratio(logp, old, "sequence", index, 2)
    assert seq.tolist() == pytest.approx([(0.2 - 0.4) / 2, (0.2 - 0.4) / 2, 0.0])
    assert log_ratio(logp, old, "token", index, 2).tolist() == pytest.approx([0.2, -0.4, 0.0])
    pg, clipped = ppo_clip_loss(logp, old, torch.tensor([1.0, 1.0, 1.0]), 0.2, 0.2, log_ratio=seq)
    assert pg.tolist() == pytest.approx([-math.exp(-0.1), -math.exp(-0.1), -1.0])
    assert not clipped.any()


def test_delta_caps_the_unclipped_ratio_of_negative_advantages() -> None:
    """ratio e^1 = 2.718, A = -1: PPO gives -min(-2.718, -1.2) = 2.718; delta 1.5 caps it at 1.5."""
    logp, old, adv = torch.tensor([0.0]), torch.tensor([-1.0]), torch.tensor([-1.0])
    pg, _ = ppo_clip_loss(logp, old, adv, 0.2, 0.2)
    assert pg.item() == pytest.approx(math.e)
    capped, _ = ppo_clip_loss(logp, old, adv, 0.2, 0.2, delta=1.5)
    assert capped.item() == pytest.approx(1.5)


def test_cispo_weights_the_log_prob_by_the_clipped_detached_ratio() -> None:
    """ratio e^0.5 = 1.6487 clipped to 1.28; loss = -1.28 * A * logp; gradient -1.28 * A (never 0)."""
    logp = torch.tensor([-0.5], requires_grad=True)
    old = torch.tensor([-1.0])
    loss, clipped = cispo_loss(logp, old, torch.tensor([2.0]), 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.28 * 2.0 * -0.5)
    assert clipped.tolist() == [True]
    loss.sum().backward()
    assert logp.grad is not None and logp.grad.item() == pytest.approx(-1.28 * 2.0)


def test_kl_estimators() -> None:
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    d = [0.5, -1.0]  # logp - ref
    assert kl_estimate(logp, ref, "k1").tolist() == pytest.approx(d)
    assert kl_estimate(logp, ref, "k2").tolist() == pytest.approx([0.5 * x * x for x in d])
    assert kl_estimate(logp, ref, "k3").tolist() == pytest.approx([math.exp(-x) + x - 1 for x in d])


def test_entropy_of_the_behaviour_distribution() -> None:
    """Uniform over 4: ln 4. With top_p 0.5 over probs (0.4, 0.3, 0.2, 0.1) the nucleus is the top 2,
    renormalised to (4/7, 3/7)."""
    assert entropy(torch.zeros(1, 4), 1.0, 1.0).item() == pytest.approx(math.log(4))
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    p = [4 / 7, 3 / 7]
    assert entropy(logits, 1.0, 0.5).item() == pytest.approx(-sum(x * math.log(x) for x in p), rel=1e-6)


def test_minibatches_by_group_index() -> None:
    plan = MinibatchPlan(groups=6, minibatches=4)
    assert [plan.index(g) for g in range(6)] == [0, 0, 1, 2, 2, 3]
    assert [plan.size(k) for k in range(4)] == [2, 1, 2, 1]
    assert plan.index(99) == 3  # an id outside 0..B-1: the last minibatch (trained at the step)


def test_lr_schedules() -> None:
    assert [lr_factor("constant", e, 2, 10) for e in range(3)] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert lr_factor("linear", 2, 2, 10) == 1.0 and lr_factor("linear", 6, 2, 10) == pytest.approx(0.5)
    assert lr_factor("cosine", 6, 2, 10) == pytest.approx(0.5) and lr_factor("cosine", 10, 2, 10) == pytest.approx(0)


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"trainer.loss_type": "gspo", "trainer.importance_sampling_level": "token"}, "sequence-level ratio"),
        ({"trainer.ref_sync_epochs": 2}, "needs beta > 0"),
        ({"trainer.num_minibatches": 9, "coordinator.groups_per_epoch": 8}, "a minibatch needs at least one group"),
        (
            {"trainer.num_minibatches": 2, "trainer.world_size": 2, "trainer.strategy": "ddp"},
            "strategy ddp does not support trainer.num_minibatches > 1",
        ),
        ({"trainer.loss_type": "ppo"}, "loss_type"),
        (
            {"trainer.num_iterations": 2, "trainer.learner": "sim", "worker.engine": "sim"},
            "need trainer.learner grpo",
        ),
    ],
)
def test_recipe_options_refused_with_one_line(overrides: dict[str, object], why: str) -> None:
    with pytest.raises(ConfigError, match=why) as err:
        load_config(None, overrides)
    assert "\n" not in str(err.value)
