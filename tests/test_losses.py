"""GRPO maths against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from prl_actors.training.losses import ADV_EPS, group_advantages, k3_kl, ppo_clip_loss


def test_advantages_use_population_std() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    # mean 0.5, population std 0.5
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5]) / (0.5 + ADV_EPS)
    assert torch.allclose(adv, expected)


def test_advantages_uneven_group() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    std = math.sqrt(0.25 * 0.75)  # Bernoulli(0.25) population std
    assert adv[0].item() == pytest.approx(0.75 / (std + ADV_EPS))
    assert adv[1].item() == pytest.approx(-0.25 / (std + ADV_EPS))
    assert adv.sum().item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("rewards", [[1.0, 1.0, 1.0], [0.0, 0.0], [0.3]])
def test_equal_rewards_give_zero_advantages(rewards: list[float]) -> None:
    assert torch.equal(group_advantages(torch.tensor(rewards)), torch.zeros(len(rewards)))


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
