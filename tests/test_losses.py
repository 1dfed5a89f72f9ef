"""GRPO maths against hand-computed numbers."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from prl_actors.config import load_config
from prl_actors.tasks import load_task
from prl_actors.training.losses import ADV_EPS, group_advantages, k3_kl, ppo_clip_loss


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
    task = load_task(cfg)
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
