"""EpochStats: the GRPO learner's running sums over the groups of one epoch, and its metrics row.

Kept below training/grpo.py and training/guard.py (both use it; guard's skip_step starts a new one), so
neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EpochStats:
    """Running sums over the groups of one epoch (plain floats: nothing holds a graph)."""

    groups: int = 0
    samples: int = 0
    tokens: int = 0
    reward_sum: float = 0.0
    correct: int = 0
    loss_sum: float = 0.0
    kl_sum: float = 0.0
    clipped: int = 0  # tokens whose clipped term is active (losses.ppo_clip_loss; cispo: weight clipped)
    clipped_low: int = 0  # ratio < 1 - eps_low with A < 0 (losses.clip_sides)
    clipped_high: int = 0  # ratio > 1 + eps_high with A > 0
    entropy_sum: float = 0.0  # the policy's behaviour entropy summed over the trained tokens
    entropy_tokens: int = 0  # the tokens it was measured on (every trained token; 0: nothing measured)
    diff_tokens: int = 0
    diff_sum: float = 0.0
    diff_max: float = 0.0
    trained_tokens: int = 0  # tokens of every forward (x mu passes); tokens: the epoch's, once
    ratio_sum: float = 0.0
    ratio_min: float = float("inf")
    ratio_max: float = 0.0
    steps: int = 0
    grad_norm_sum: float = 0.0
    is_tokens: int = 0  # tokens with an engine log-prob (trainer.is_correction's ratio is known)
    is_sum: float = 0.0
    is_min: float = float("inf")
    is_max: float = 0.0
    is_corrected: int = 0  # of them: capped (tis) or masked (mis)

    def add_ratio(self, ratio: torch.Tensor) -> None:
        """ratio: [N] the importance ratio of each trained token (1 before the epoch's first step)."""
        if ratio.numel():
            self.ratio_sum += float(ratio.sum())
            self.ratio_min = min(self.ratio_min, float(ratio.min()))
            self.ratio_max = max(self.ratio_max, float(ratio.max()))

    def add_rewards(self, rewards: list[float], whole: bool = True) -> None:
        """A group's rewards (or, `whole` False, those of the part of a group a trainer rank holds
        besides its first samples: the group is counted where they are)."""
        self.groups += int(whole)
        self.samples += len(rewards)
        self.reward_sum += sum(rewards)
        self.correct += sum(r >= 1.0 for r in rewards)

    def add_logprob_diff(self, engine: torch.Tensor, trainer: torch.Tensor) -> None:
        """engine: [N] behaviour log-probs the engine reported (NaN where a sample had none);
        trainer: [N] the policy's log-probs of the same tokens."""
        diff = (engine - trainer.detach().to("cpu", torch.float64)).abs()  # [N]
        diff = diff[~diff.isnan()]
        if diff.numel():
            self.diff_tokens += diff.numel()
            self.diff_sum += float(diff.sum())
            self.diff_max = max(self.diff_max, float(diff.max()))

    def add_is(self, rho: torch.Tensor, corrected: torch.Tensor) -> None:
        """rho: [N] engine-mismatch ratios exp(old - engine) of the trained tokens (NaN: unknown);
        corrected: [N] bool, capped or masked by trainer.is_correction."""
        known = ~rho.isnan()
        if bool(known.any()):
            r = rho[known]
            self.is_tokens += r.numel()
            self.is_sum += float(r.sum())
            self.is_min = min(self.is_min, float(r.min()))
            self.is_max = max(self.is_max, float(r.max()))
            self.is_corrected += int(corrected[known].sum())

    def is_metrics(self) -> dict[str, float]:
        """is_ratio_mean / min / max over the tokens with an engine log-prob (NaN if none) and
        is_corrected_frac: the share of them capped (tis) or masked (mis); 0 with is_correction none."""
        n = self.is_tokens
        nan = float("nan")
        return {
            "is_ratio_mean": self.is_sum / n if n else nan,
            "is_ratio_min": self.is_min if n else nan,
            "is_ratio_max": self.is_max if n else nan,
            "is_corrected_frac": self.is_corrected / n if n else 0.0,
        }

    def metrics(self) -> dict[str, float]:
        samples, trained = max(self.samples, 1), max(self.trained_tokens, 1)
        row = {
            "reward_mean": self.reward_sum / samples,
            "accuracy": self.correct / samples,
            "loss": self.loss_sum / trained,
            "kl": self.kl_sum / trained,
            "clip_frac": self.clipped / trained,
            "clip_frac_low": self.clipped_low / trained,
            "clip_frac_high": self.clipped_high / trained,
            "ratio_mean": self.ratio_sum / trained if self.trained_tokens else 1.0,
            "ratio_min": self.ratio_min if self.trained_tokens else 1.0,
            "ratio_max": self.ratio_max if self.trained_tokens else 1.0,
            "optimizer_steps": float(self.steps),
            "logprob_diff_max": self._diff(self.diff_max),
            "logprob_diff_mean": self._diff(self.diff_sum / max(self.diff_tokens, 1)),
            "tokens": float(self.tokens),
            "samples": float(self.samples),
            "groups": float(self.groups),
            "response_len": self.tokens / samples,
        }
        return row | self.is_metrics() | self.entropy_metrics()

    def entropy_metrics(self) -> dict[str, float]:
        """entropy: the mean per-token entropy of the policy's behaviour distribution over the trained
        tokens (every forward of the epoch, as loss); absent when it was not measured."""
        return {"entropy": self.entropy_sum / self.entropy_tokens} if self.entropy_tokens else {}

    def _diff(self, value: float) -> float:
        """NaN when tokens were trained but no engine log-prob came with them (nothing measured)."""
        return float("nan") if self.tokens and not self.diff_tokens else value
