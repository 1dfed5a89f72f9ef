"""GRPO maths as pure tensor functions (hand-checkable in tests).

Per token t of sample i: ratio_t = exp(logp_t - old_logp_t), and

    pg_t = -min(ratio_t * A_i, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A_i)
    kl_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1          (k3 estimator of KL(pi || ref), >= 0)
    loss_t = pg_t + beta * kl_t

The learner sums w_t * loss_t over every response token of a minibatch (w_t: `token_weights`, the
loss type's per-sequence factor) and divides by the minibatch's normaliser once, at its optimizer
step (`normaliser`: known from the minibatch's groups, so the result does not depend on the order
groups arrive in, nor on how they were cut into micro-batches). The recipes (docs/LEARNING.md):

    loss_type   ratio per   loss_t                                   normaliser
    dapo, bnpo  token       PPO clip                                 unmasked tokens
    grpo        token       PPO clip, w_t = 1/|o_i|                  unmasked sequences
    dr_grpo     token       PPO clip                                 sequences x max_new_tokens
    gspo        sequence    PPO clip on s_i, w_t = 1/|o_i|           unmasked sequences
    cispo       token       -sg(clip(ratio)) * A * logp_t             unmasked tokens
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from prl_actors.training.behaviour import Behaviour, as_behaviour, shaped_logits

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


def scaled_advantages(rewards: torch.Tensor, scale: str, batch_std: float | None = None) -> torch.Tensor:
    """Advantages of one group under `scale_rewards`: group (`group_advantages`), none (r - mean,
    Dr. GRPO), batch ((r - mean) / (batch_std + 1e-6), batch_std the epoch's population std of every
    reward, `batch_reward_std`). Equal rewards give exact zeros in every mode. rewards: [G] -> [G] f64."""
    if scale == "group":
        return group_advantages(rewards)
    r = rewards.double()
    if r.numel() == 0 or bool((r == r[0]).all()):
        return torch.zeros_like(r)
    centred = r - r.mean()
    if scale == "none":
        return centred
    if batch_std is None:
        raise ValueError("scale_rewards batch needs the epoch's reward std")
    return centred / (batch_std + ADV_EPS)


def host_advantages(rewards: Sequence[float], scale: str, batch_std: float | None = None) -> list[float]:
    """`scaled_advantages` in plain Python floats (float64, as the tensor version up to summation
    order): what the gpu impl computes on the host, so no torch op or sync is spent per group."""
    n = len(rewards)
    if n == 0 or all(r == rewards[0] for r in rewards):
        return [0.0] * n
    mean = math.fsum(rewards) / n
    centred = [r - mean for r in rewards]
    if scale == "none":
        return centred
    if scale == "group":
        std = math.sqrt(math.fsum(c * c for c in centred) / n)
    elif batch_std is None:
        raise ValueError("scale_rewards batch needs the epoch's reward std")
    else:
        std = batch_std
    return [c / (std + ADV_EPS) for c in centred]


def batch_reward_std(rewards: list[float]) -> float:
    """Population std of every reward of the epoch (float64; the order of `rewards` is irrelevant
    up to float summation order)."""
    return float(torch.tensor(rewards, dtype=torch.float64).std(correction=0)) if rewards else 0.0


def sequence_mean(values: torch.Tensor, sample_index: torch.Tensor, n_samples: int) -> torch.Tensor:
    """Per token, the mean of `values` over its own sample's tokens: [N] -> [N] (differentiable)."""
    sums = torch.zeros(n_samples, dtype=values.dtype, device=values.device).index_add(0, sample_index, values)
    counts = torch.zeros(n_samples, dtype=values.dtype, device=values.device).index_add(
        0, sample_index, torch.ones_like(values)
    )
    return (sums / counts.clamp(min=1))[sample_index]  # [N]


def log_ratio(
    logp: torch.Tensor, old_logp: torch.Tensor, level: str, sample_index: torch.Tensor, n_samples: int
) -> torch.Tensor:
    """[N] log importance ratio: per token (token), or the sequence's mean for each of its tokens
    (sequence, GSPO: s_i = (pi(o_i) / pi_old(o_i)) ** (1 / |o_i|))."""
    diff = logp - old_logp  # [N]
    return diff if level == "token" else sequence_mean(diff, sample_index, n_samples)


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    eps_low: float,
    eps_high: float,
    delta: float | None = None,
    log_ratio: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token clipped policy-gradient loss [N], per-token bool "the clipped term is active" [N]).
    logp, old_logp: [N]; adv: [N] (each token carries its sample's advantage). `delta` (TRL, two-sided
    clip): the unclipped term's ratio is capped at delta. `log_ratio` ([N]) replaces logp - old_logp
    (the sequence-level ratio of GSPO)."""
    ratio = torch.exp(logp - old_logp if log_ratio is None else log_ratio)  # [N]
    unclipped = (ratio if delta is None else torch.clamp(ratio, max=delta)) * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).detach()


def clip_sides(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(low [N], high [N]) bool: the tokens whose ratio the clip holds at its low side (ratio <
    1 - eps_low with A < 0) and at its high side (ratio > 1 + eps_high with A > 0), as TRL's
    clip_ratio/low_mean and high_mean. ratio, adv: [N] (each token carries its sample's advantage)."""
    low = (ratio < 1.0 - eps_low) & (adv < 0)
    high = (ratio > 1.0 + eps_high) & (adv > 0)
    return low, high


def cispo_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1): -sg(clip(ratio, 1 - eps_low, 1 + eps_high)) * A * logp per token [N]: every
    token keeps a gradient (the clip bounds only its weight); and the bool "the weight was clipped" [N]."""
    ratio = torch.exp(logp - old_logp).detach()  # [N]
    weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return -weight * adv * logp, (weight != ratio)


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference), [N]: k1 = logp - ref, k2 = (logp - ref)^2 / 2,
    k3 (`k3_kl`). Schulman's estimators; k2 and k3 are >= 0."""
    if estimator == "k3":
        return k3_kl(logp, ref_logp)
    diff = logp - ref_logp
    return diff if estimator == "k1" else 0.5 * diff * diff


def token_weights(loss_type: str, keep: torch.Tensor, sample_index: torch.Tensor, n_samples: int) -> torch.Tensor:
    """w_t, [N]: 0 on masked tokens (keep: [N] bool), else 1/|o_i| for the per-sequence means (grpo,
    gspo) and 1 for the token sums (dapo, bnpo, dr_grpo, cispo)."""
    w = keep.to(torch.float64)
    if loss_type in ("grpo", "gspo"):
        lengths = torch.zeros(n_samples, dtype=torch.float64, device=w.device).index_add(0, sample_index, w)
        w = w / lengths.clamp(min=1)[sample_index]
    return w


def normaliser(loss_type: str, tokens: int, sequences: int, samples: int, max_new_tokens: int) -> float:
    """What a minibatch's weighted loss sum is divided by (>= 1): its unmasked tokens (dapo, bnpo,
    cispo), its unmasked sequences (grpo, gspo), or samples x max_new_tokens (dr_grpo: a constant)."""
    if loss_type in ("grpo", "gspo"):
        return float(max(sequences, 1))
    if loss_type == "dr_grpo":
        return float(max(samples * max_new_tokens, 1))
    return float(max(tokens, 1))


def entropy(
    logits: torch.Tensor, temperature: float | Behaviour, top_p: float = 1.0, context: torch.Tensor | None = None
) -> torch.Tensor:
    """Entropy of the behaviour distribution (training/behaviour.py: penalty, temperature, min_p,
    top_k, top-p) per row, [N] (differentiable through `logits`, [N, V]; `context` [N, C] with a
    repetition penalty)."""
    logq = torch.log_softmax(shaped_logits(logits, as_behaviour(temperature, top_p), context), dim=-1)  # [N, V]
    return -(logq.exp() * logq.nan_to_num(neginf=0.0)).sum(-1)


def optional_entropy(
    logits: torch.Tensor, b: Behaviour, context: torch.Tensor | None, with_grad: bool, measure: bool
) -> torch.Tensor | None:
    """[N] `entropy` of logits [N, V]: with its gradient (`with_grad`: the entropy bonus), or with
    `measure` alone its value under no_grad (the entropy metric); None when neither is asked for."""
    if with_grad:
        return entropy(logits, b, context=context)
    if not measure:
        return None
    with torch.no_grad():
        return entropy(logits.detach(), b, context=context)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(policy || reference) per token, [N], always >= 0."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def engine_is_weights(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, mode: str, cap: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Engine-mismatch importance weights, detached (trainer.is_correction; TIS, Yao et al. 2025):
    rho_t = exp(old_logp_t - engine_logp_t), the trainer's old policy over the engine that sampled t.

        none  w_t = 1
        tis   w_t = min(rho_t, cap)                        (truncated IS)
        mis   w_t = rho_t if rho_t <= cap else 0            (masked IS: the token leaves the loss)

    A token without an engine log-prob (NaN: an environment token, a sample whose log-probs do not
    match) gets w_t = 1. Per token, so the weights depend on nothing but the token and the epoch-start
    policy (periodic == sync). old_logp, engine_logp: [N] -> (w [N], rho [N] with NaN where unknown,
    corrected [N] bool: capped (tis) or masked (mis))."""
    old = old_logp.detach().to(torch.float64)
    engine = engine_logp.to(old.device, torch.float64)
    known = ~engine.isnan()  # [N]
    rho = torch.where(known, torch.exp(old - engine.nan_to_num(0.0)), torch.full_like(old, float("nan")))  # [N]
    over = known & (rho > cap)  # [N]
    if mode == "none":
        return torch.ones_like(old), rho, torch.zeros_like(known)
    if mode == "tis":
        w = torch.where(known, torch.clamp(rho, max=cap), torch.ones_like(old))
    else:
        w = torch.where(over, torch.zeros_like(old), torch.where(known, rho, torch.ones_like(old)))
    return w, rho, over
