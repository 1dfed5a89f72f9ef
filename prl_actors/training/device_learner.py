"""The GRPO learner's accelerator path (trainer.impl gpu): one micro-batch as a constant number of ops.

`DeviceFlush` is mixed into GRPOLearner; `_flush` calls `_flush_device` when the learner's impl is
gpu (auto: on a cuda / npu device). Same maths and the same gradients as the CPU path
(`_flush_cpu`: tests/test_trainer_device_path.py), laid out for a device that pays per launched
kernel and per host sync:

* the batch is built on the host and moved as two tensors (training/device_batch.py), its counts
  (the normaliser's tokens and sequences, trained tokens) come from the host lists: no sync;
* attention runs over packed rows with a block mask made by tensor ops, the log-probs through the
  chunked head (training/device_forward.py); the reference (and the frozen epoch-start policy,
  when M x mu > 1) run on the same batch and mask, before the policy so their activations are gone
  when the policy's are held;
* advantages are computed on the host (losses.host_advantages), from Python floats;
* the epoch's metrics stay on the device (`DeviceStats`: sums and peaks as two small tensors) and are
  read once, by `_fold_stats`, when someone needs them (the step's metrics, the non-finite check, a
  rank's all-reduce): one host sync per read, none per micro-batch. The gradient norm of each
  optimizer step is added there too.
* micro_batch_tokens auto sizes a micro-batch from the device's free memory (`_micro_batch_tokens`,
  read at every epoch's start; docs/MEMORY.md).
Not covered (they work, with per-sample host ops): the repetition penalty's contexts
(behaviour.response_contexts builds them per sample).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from prl_actors.model.memory import activation_bytes_per_token, token_budget
from prl_actors.training.behaviour import Behaviour, response_contexts
from prl_actors.training.device_batch import DeviceBatch, allowed_mask, build
from prl_actors.training.device_forward import attention_mask, device_logprobs
from prl_actors.training.losses import clip_sides, engine_is_weights, kl_estimate, token_weights
from prl_actors.training.trimodel import TriLogprobs

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Group
    from prl_actors.training.epoch_stats import EpochStats

SUMS = (
    "loss_sum",
    "kl_sum",
    "clipped",
    "clipped_low",
    "clipped_high",
    "entropy_sum",
    "ratio_sum",
    "diff_tokens",
    "diff_sum",
    "is_tokens",
    "is_sum",
    "is_corrected",
    "grad_norm_sum",
)
PEAKS = ("ratio_max", "ratio_min", "diff_max", "is_max", "is_min")
"""Peaks are kept as maxima; a minimum as the maximum of its negation."""
COUNTS = frozenset({"clipped", "clipped_low", "clipped_high", "diff_tokens", "is_tokens", "is_corrected"})


def resolve_impl(impl: str, device: torch.device) -> str:
    """trainer.impl: auto is gpu on an accelerator (cuda, npu), cpu on the CPU."""
    if impl != "auto":
        return impl
    return "cpu" if device.type == "cpu" else "gpu"


def free_memory(device: torch.device) -> int | None:
    """Free bytes on an accelerator (None on the CPU, or a backend that does not say): what the driver
    has free plus what torch's caching allocator holds unused (it hands that out first)."""
    backend = getattr(torch, device.type, None) if device.type != "cpu" else None
    info = getattr(backend, "mem_get_info", None)
    if info is None:
        return None
    free, _total = info(device)
    reserved, allocated = getattr(backend, "memory_reserved", None), getattr(backend, "memory_allocated", None)
    cached = reserved(device) - allocated(device) if callable(reserved) and callable(allocated) else 0
    return int(free + cached)


class DeviceStats:
    """The epoch's metric sums [len(SUMS)] and peaks [len(PEAKS)] as float64 device tensors."""

    def __init__(self) -> None:
        self.sums: torch.Tensor | None = None
        self.peaks: torch.Tensor | None = None

    def add(self, device: torch.device, **values: torch.Tensor) -> None:
        """Add named 0-dim tensors (sums by name in SUMS, peaks by name in PEAKS; others absent: 0 / -inf)."""
        zero = torch.zeros((), dtype=torch.float64, device=device)
        low = torch.full((), float("-inf"), dtype=torch.float64, device=device)
        sums = torch.stack([values[k].to(torch.float64) if k in values else zero for k in SUMS])
        peaks = torch.stack([_peak(k, values[k]) if k in values else low for k in PEAKS])
        self.sums = sums if self.sums is None else self.sums + sums
        self.peaks = peaks if self.peaks is None else torch.maximum(self.peaks, peaks)

    def fold(self, stats: EpochStats) -> None:
        """Add what is held into `stats` (one host read) and start again from nothing."""
        if self.sums is None or self.peaks is None:
            return
        values = torch.cat([self.sums, self.peaks]).tolist()
        self.sums = self.peaks = None
        for key, v in zip(SUMS, values, strict=False):
            setattr(stats, key, getattr(stats, key) + (round(v) if key in COUNTS else v))
        peak = dict(zip(PEAKS, values[len(SUMS) :], strict=True))
        stats.ratio_max = max(stats.ratio_max, peak["ratio_max"])
        stats.ratio_min = min(stats.ratio_min, -peak["ratio_min"])
        stats.diff_max = max(stats.diff_max, peak["diff_max"])
        stats.is_max = max(stats.is_max, peak["is_max"])
        stats.is_min = min(stats.is_min, -peak["is_min"])


def _peak(key: str, value: torch.Tensor) -> torch.Tensor:
    v = value.to(torch.float64)
    return -v if key.endswith("_min") else v


def _where(mask: torch.Tensor, value: torch.Tensor, other: float) -> torch.Tensor:
    return torch.where(mask, value, torch.full((), other, dtype=value.dtype, device=value.device))


class DeviceFlush:
    """The gpu impl's micro-batch (mixed into GRPOLearner, which provides these attributes)."""

    cfg: Any
    device: torch.device
    dtype: torch.dtype
    impl: str
    optimizer: torch.optim.Optimizer
    tri: Any
    frozen: torch.nn.Module | None
    stats: EpochStats
    norm: Any
    first_pass: bool
    epoch_steps: int
    device_stats: DeviceStats
    policy: Any

    def _micro_batch_tokens(self) -> int:
        """trainer.micro_batch_tokens, or for auto with the gpu impl on an accelerator the tokens whose
        activations fit in the memory free now (read again at every epoch's start: a process sharing
        the device, e.g. an engine that started later, is seen; the gradients, and AdamW's state until
        the first step, are set aside: they are not allocated at an epoch's start)."""
        free = free_memory(self.device) if self.impl == "gpu" and self.cfg.micro_batch_tokens == "auto" else None
        if free is None:
            return self.cfg.fixed_micro_batch_tokens()
        c = self.policy.config
        per_token = activation_bytes_per_token(
            c.hidden_size,
            getattr(c, "intermediate_size", 4 * c.hidden_size),
            c.num_hidden_layers,
            torch.empty((), dtype=self.dtype).element_size(),
            self.cfg.gradient_checkpointing,
        )
        trained = sum(p.numel() * p.element_size() for p in self.policy.parameters() if p.requires_grad)
        pending = trained * (1 if self.optimizer.state else 3)  # the gradient (+ AdamW's m and v before a step)
        return token_budget(free, pending, per_token)

    def _autocast(self) -> contextlib.AbstractContextManager[None]:  # provided by GRPOLearner
        raise NotImplementedError

    def _advantage_values(self, group: Group) -> list[float]:  # provided by GRPOLearner
        raise NotImplementedError

    def _token_losses(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # GRPOLearner's
        raise NotImplementedError

    def _flush_device(self, groups: list[Group]) -> None:
        """Forward/backward `groups` as one micro-batch; the summed loss adds to .grad."""
        c = self.cfg
        adv = [a for g in groups for a in self._advantage_values(g)]
        batch = build(groups, adv, c.shared_prompt, c.mask_truncated_completions, self.device)
        self.norm.sequences += batch.kept_samples
        self.norm.samples += batch.samples
        if batch.tokens == 0:
            return
        self.norm.tokens += batch.kept_tokens
        out = self._tri_device(groups, batch)
        adv_tok = batch.adv.to(out.policy.dtype)[batch.sample_index]  # [N]
        is_w, rho, corrected = engine_is_weights(out.old, batch.engine, c.is_correction, c.is_cap)  # [N] x 3
        per_token, ratio, clipped = self._token_losses(
            out, adv_tok, batch.sample_index, batch.samples, is_w.to(out.policy)
        )  # [N] x 3
        weights = token_weights(c.loss_type, batch.keep, batch.sample_index, batch.samples).to(per_token)  # [N]
        (weights * per_token).sum().backward()
        self.stats.trained_tokens += batch.kept_tokens
        if self.first_pass:
            self.stats.tokens += batch.model_tokens
        if out.entropy is not None:
            self.stats.entropy_tokens += batch.kept_tokens
        low, high = clip_sides(ratio, adv_tok, c.eps_low, c.eps_high)  # [N] x 2
        self._record_device(batch, out, per_token, ratio, (clipped, low, high), rho, corrected)

    def _tri_device(self, groups: list[Group], batch: DeviceBatch) -> TriLogprobs:
        """Policy (with grad), old and reference log-probs over one mask; the no-grad ones first."""
        b: Behaviour = self.tri.transform
        context = None
        if b.penalised:
            pairs = [(g.prompt_ids, [s.token_ids for s in g.samples]) for g in groups]
            context = response_contexts(pairs).to(self.device)  # [N, C]
        with self._autocast():
            mask = attention_mask(self.policy, allowed_mask(batch.segment, batch.sample), batch.position_ids)
            with torch.no_grad():
                old = None
                if self.epoch_steps > 0 and self.frozen is not None:
                    old = device_logprobs(self.frozen, batch, mask, b, context)[0]
                ref = None
                if self.tri.reference is not None:
                    ref = device_logprobs(self.tri.reference, batch, mask, b, context)[0]
                elif self.tri.adapter_reference:
                    with self.policy.disable_adapter():
                        ref = device_logprobs(self.policy, batch, mask, b, context)[0]
            logp, ent = device_logprobs(self.policy, batch, mask, b, context, self.cfg.entropy_coef > 0, True)
        old_logp = logp.detach() if old is None else old.to(logp)
        return TriLogprobs(policy=logp, old=old_logp, ref=ref, entropy=ent)

    def _record_device(
        self,
        batch: DeviceBatch,
        out: TriLogprobs,
        per_token: torch.Tensor,
        ratio: torch.Tensor,
        clips: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        rho: torch.Tensor,
        corrected: torch.Tensor,
    ) -> None:
        """The micro-batch's metric sums and peaks, added on the device (see DeviceStats). clips: [N]
        bool x 3, the clipped term active, the clip's low side, its high side (losses.clip_sides)."""
        keep = batch.keep  # [N] bool
        clipped, low, high = clips
        v: dict[str, torch.Tensor] = {
            "loss_sum": _where(keep, per_token.detach(), 0.0).sum(),
            "clipped": (clipped & keep).sum(),
            "clipped_low": (low & keep).sum(),
            "clipped_high": (high & keep).sum(),
            "ratio_sum": _where(keep, ratio, 0.0).sum(),
            "ratio_max": _where(keep, ratio, float("-inf")).max(),
            "ratio_min": _where(keep, ratio, float("inf")).min(),
        }
        if out.ref is not None:
            kl = kl_estimate(out.policy.detach(), out.ref, self.cfg.kl_estimator)  # [N]
            v["kl_sum"] = _where(keep, kl, 0.0).sum()
        if out.entropy is not None:
            v["entropy_sum"] = _where(keep, out.entropy.detach(), 0.0).sum()
        if self.first_pass:
            diff = (batch.engine - out.old.to(torch.float64)).abs()  # [N], NaN where the engine gave none
            known = ~diff.isnan()
            v |= {"diff_tokens": known.sum(), "diff_sum": _where(known, diff, 0.0).sum()}
            v["diff_max"] = _where(known, diff, float("-inf")).max()
            seen = keep & ~rho.isnan()
            v |= {"is_tokens": seen.sum(), "is_sum": _where(seen, rho, 0.0).sum()}
            v |= {"is_max": _where(seen, rho, float("-inf")).max(), "is_min": _where(seen, rho, float("inf")).min()}
            v["is_corrected"] = (corrected & seen).sum()
        self.device_stats.add(self.device, **v)
