"""GRPO maths as pure tensor functions (hand-checkable in tests).

Per token t of sample i: ratio_t = exp(logp_t - old_logp_t), and

    pg_t = -min(ratio_t * A_i, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A_i)
    kl_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1          (k3 estimator of KL(pi || ref), >= 0)
    loss_t = pg_t + beta * kl_t

The learner sums loss_t over every response token of the epoch and divides by the epoch's token
count once, at the step (so the result does not depend on the order groups arrive in).
"""

from __future__ import annotations

import torch

ADV_EPS = 1e-6


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A_i = (r_i - mean(r)) / (std(r) + 1e-6), std the *population* std (divide by G, so G = 1 is
    defined), computed in float64. A group whose rewards are all equal gets exactly zero advantages,
    whatever the value: the float residue of mean(r) - r_i (e.g. 0.9 x 6) would otherwise be divided
    by a std of the same tiny size and become an advantage of order 0.01-0.1.
    rewards: [G] -> [G] float64."""
    r = rewards.double()
    if r.numel() == 0 or bool((r == r[0]).all()):
        return torch.zeros_like(r)
    centred = r - r.mean()
    return centred / (r.std(correction=0) + ADV_EPS)


def ppo_clip_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token clipped policy-gradient loss [N], per-token bool "the clipped term is active" [N]).
    logp, old_logp: [N]; adv: [N] (each token carries its sample's advantage)."""
    ratio = torch.exp(logp - old_logp)  # [N]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).detach()


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(policy || reference) per token, [N], always >= 0."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0
