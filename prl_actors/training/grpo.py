"""GRPO learner: the GRPO family (loss_type, scale_rewards, ...), M x mu optimizer steps per epoch,
one published version per epoch.

Invariants:
* `step` bumps `version` by exactly 1, after the epoch's M x mu optimizer steps (num_minibatches x
  num_iterations; 1 x 1 by default). `accumulate` steps only when the first pass's open minibatch k
  (groups with group_id * M // B == k: training/minibatch.py) is complete and k < M - 1; groups of a
  later minibatch wait, held. So each step takes the same groups at the same weights in periodic and
  sync mode, whatever the arrival order.
* The loss is a weighted *sum* over response tokens during accumulation (losses.token_weights); each
  optimizer step divides the summed gradients by its minibatch's normaliser (losses.normaliser:
  counted from the minibatch's groups), so the update is the same whatever order (and whatever
  micro-batching) the groups arrived in, up to float summation order. scale_rewards batch needs the
  epoch's reward std: nothing trains before every group is in (exact; the overlap is given up).
* Groups of the open minibatch are trained in arrival order, in micro-batches: `accumulate` queues,
  and the queue is trained once it holds `trainer.micro_batch_tokens` packed tokens (or
  `micro_batch_groups` groups), or when the trainer calls `flush` because nothing else waits.
* Two training paths give the same update (`trainer.impl`): cpu (`_flush_cpu`: bucketed block
  attention, metrics read per micro-batch) and gpu (training/device_learner.py: packed rows under one
  block mask, chunked head, metrics kept on the device and read by `_fold_stats`: a constant number of
  kernels and no host sync per micro-batch). Whoever reads `stats` folds them first (step,
  nonfinite_cause, skip_step, a rank's _synchronise).
* Old log-probs: before the epoch's first optimizer step they are the policy's own, detached (see
  trimodel.py: ratio exactly 1, clip_frac 0); after it, from a frozen copy of the epoch-start policy
  (kept only when M x mu > 1), so the ratio departs from 1 and eps_low / eps_high / delta act.
  Tokens are scored under the behaviour
  transform the engine sampled with (penalty, temperature, min_p, top_k, top-p: behaviour.py). The
  engine's log-probs are not used by the loss; each epoch reports |engine - trainer| over its tokens (logprob_diff_max,
  logprob_diff_mean). The policy runs in eval mode (no dropout).
* Precision: master weights, gradients and AdamW state are float32 (float64 if model.dtype is
  float64) whatever `model.dtype`; with bfloat16 the forward runs under torch.autocast in bfloat16.
  `weights()` (what workers get) is cast to `model.dtype`; checkpoints keep the master weights.
* LoRA (`trainer.lora`, training/lora.py): the base is frozen in `model.dtype` and only the adapter
  trains (float32 master, the only parameters the optimizer holds); the reference is the base with
  the adapter disabled; `weights()` is the adapter alone (cast to `model.dtype`) plus its
  description, and checkpoints hold the adapter.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from transformers import PreTrainedModel

from prl_actors.data import position
from prl_actors.model.builtin import load_model
from prl_actors.model.device import resolve_device, resolve_dtype
from prl_actors.model.lora import base_fingerprint
from prl_actors.sections import GREEDY_REFUSED, ConfigError
from prl_actors.training import checkpoint, lora
from prl_actors.training.behaviour import Behaviour, response_contexts
from prl_actors.training.device_learner import DeviceFlush, DeviceStats, resolve_impl
from prl_actors.training.epoch_stats import EpochStats as EpochStats  # re-exported (rank_learner)
from prl_actors.training.guard import GuardedGRPO
from prl_actors.training.losses import (
    batch_reward_std,
    cispo_loss,
    clip_sides,
    engine_is_weights,
    host_advantages,
    kl_estimate,
    log_ratio,
    normaliser,
    ppo_clip_loss,
    scaled_advantages,
    token_weights,
)
from prl_actors.training.minibatch import EpochRun, MinibatchPlan, lr_factor
from prl_actors.training.packing import ModelBatch, collate, response_logprobs
from prl_actors.training.trimodel import TriLogprobs, TriModel

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Group
    from prl_actors.trainer.config import TrainerSection
    from prl_actors.training.settings import LearnerSettings


def adamw(params: list[torch.nn.Parameter], lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """AdamW, fused where the parameters' device has the fused kernel (CPU and CUDA: one kernel for
    every tensor instead of a loop of small ops; 2-3x faster steps on CPU), else the default."""
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, ValueError):  # a device (or tensor type) without the fused kernel
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


@dataclass
class Norm:
    """The normaliser counts of the minibatch being trained (a rank group sums them before its step)."""

    tokens: int = 0  # unmasked response tokens
    sequences: int = 0  # unmasked samples
    samples: int = 0  # every sample


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Hugging Face gradient checkpointing (non-reentrant). HF checkpoints only in training mode, so
    the model is put in train mode with every dropout off: the forward stays deterministic, as in
    eval mode (attention dropout is a float on HF attention modules, set to 0 here)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)  # type: ignore[operator]
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.eval()
        if isinstance(getattr(m, "attention_dropout", None), float):
            setattr(m, "attention_dropout", 0.0)  # noqa: B010 (an attribute torch.nn.Module does not declare)


def engine_logprobs(groups: list[Group]) -> torch.Tensor:
    """[N] float64: the engine's log-prob of every response token (group, sample, position order,
    as in ModelBatch); NaN for the tokens of a sample whose logprobs do not match its model tokens,
    and for environment tokens of a multi-turn sample (they have none: Sample.loss_mask)."""
    out: list[float] = []
    for s in (s for g in groups for s in g.samples):
        mask = s.model_mask()
        if len(s.logprobs) != sum(mask):
            out += [float("nan")] * len(s.token_ids)
            continue
        given = iter(s.logprobs)
        out += [next(given) if m else float("nan") for m in mask]
    return torch.tensor(out, dtype=torch.float64)


def loss_mask(groups: list[Group]) -> torch.Tensor:
    """[N] float64: 1 for a token the model sampled, 0 for an environment / tool token of a multi-turn
    sample (in the context, never in the loss); same order as ModelBatch's response tokens."""
    return torch.tensor([m for g in groups for s in g.samples for m in s.model_mask()], dtype=torch.float64)


class GRPOLearner(DeviceFlush, GuardedGRPO):
    """Learner protocol on a local HF model directory (the initial weights are also the reference)."""

    def __init__(self, settings: LearnerSettings, model_dir: Path | str | None) -> None:
        if model_dir is None:
            raise ConfigError("the grpo learner needs a model directory (prepare_model)")
        self.cfg = trainer = settings.trainer
        self.model_dir = Path(model_dir)
        sampling = settings.sampling
        if sampling.temperature == 0:
            raise ConfigError(GREEDY_REFUSED)
        self.device = resolve_device(trainer.device)
        self.dtype = resolve_dtype(settings.dtype)  # compute dtype, and the dtype workers get
        master = torch.promote_types(self.dtype, torch.float32)
        self.lora = trainer.lora
        if self.lora is None:
            policy = load_model(model_dir, self.device, master)
        else:  # the frozen base in the compute dtype, the adapter in the master dtype
            policy = lora.wrap(
                load_model(model_dir, self.device, self.dtype), self.lora, master, self.model_dir, settings.seed
            )
        self.base_fingerprint = base_fingerprint(self.model_dir) if self.lora is not None else ""
        if trainer.gradient_checkpointing:
            enable_checkpointing(policy)
        self.tri = TriModel(policy, trainer.beta > 0, Behaviour.of(sampling))
        trained = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = adamw(trained, trainer.lr, trainer.weight_decay)
        self.version = 0
        self.epoch = -1
        self.stats = EpochStats()
        self._pending: list[Group] = []
        self._pending_tokens = 0
        self.max_new_tokens = sampling.max_new_tokens
        self.horizon = settings.epochs  # of the lr schedule; a checkpoint's own wins on resume
        multi_step = trainer.num_minibatches * trainer.num_iterations > 1
        self.frozen = copy.deepcopy(policy).requires_grad_(False) if multi_step else None  # epoch-start policy
        self.norm = Norm()
        self.run: EpochRun[Group] = EpochRun(MinibatchPlan(0, 1))
        self.batch_std: float | None = None
        self.epoch_steps = 0  # optimizer steps taken in this epoch
        self.first_pass = True
        self.data_identity = settings.data_identity()  # recorded with each checkpoint (data/position.py)
        self.impl = resolve_impl(trainer.impl, self.device)
        self.device_stats = DeviceStats()  # the gpu impl's metrics, on the device until _fold_stats
        self.micro_batch_tokens = self._micro_batch_tokens()

    @property
    def policy(self) -> PreTrainedModel:
        return cast(PreTrainedModel, self.tri.policy)

    def _autocast(self) -> contextlib.AbstractContextManager[None]:
        """bfloat16 compute on the float32 master (a no-op when model.dtype is the master's dtype)."""
        if self.policy.dtype == self.dtype:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def begin_epoch(self, epoch: int, n_groups: int) -> None:
        """Start from zero gradients and empty stats (drops a half-accumulated epoch, if any)."""
        self.epoch = epoch
        self._reset_epoch(n_groups)

    def _reset_epoch(self, n_groups: int) -> None:
        self.stats = EpochStats()
        self._pending, self._pending_tokens = [], 0
        self.optimizer.zero_grad(set_to_none=True)
        minibatches = max(1, min(self.cfg.num_minibatches, n_groups))
        self.run = EpochRun(MinibatchPlan(n_groups, minibatches), gated=self.cfg.scale_rewards == "batch")
        self.norm, self.batch_std, self.epoch_steps, self.first_pass = Norm(), None, 0, True
        self.device_stats = DeviceStats()
        self.micro_batch_tokens = self._micro_batch_tokens()  # auto on an accelerator: from the memory free now

    def accumulate(self, group: Group) -> dict[str, float]:
        """Hold `group` in its minibatch; if that is the open one, queue it (forward/backward once the
        queue fills a micro-batch); step the open minibatch once it is complete (not the last one)."""
        rewards = [s.reward for s in group.samples]
        self.stats.add_rewards(rewards)
        k = self.run.add(group.group_id, group)
        if self.run.gated and self.run.all_in():
            self._open_gate()
        elif k == self.run.open and not self.run.gated:
            self._queue(group)
        self._advance()
        tokens = sum(len(s.token_ids) for s in group.samples)
        return {"reward_mean": sum(rewards) / max(len(rewards), 1), "tokens": float(tokens)}

    def _queue(self, group: Group) -> None:
        self._pending.append(group)
        self._pending_tokens += self._cost(group)
        if self._pending_tokens >= self.micro_batch_tokens or len(self._pending) >= self.cfg.micro_batch_groups:
            self._flush()

    def _open_gate(self) -> None:
        """scale_rewards batch: every group is in; fix the epoch's reward std, queue the open minibatch."""
        rewards = [s.reward for held in self.run.held for g in held for s in g.samples]
        self.batch_std, self.run.gated = batch_reward_std(rewards), False
        for g in self.run.held[self.run.open]:
            self._queue(g)

    def _advance(self) -> None:
        """Step every complete open minibatch of the first pass (not the last) and queue the next one."""
        while self.run.can_step_early():
            self._optimizer_step()
            self.run.open += 1
            for g in self.run.held[self.run.open]:
                self._queue(g)

    def _cost(self, group: Group) -> int:
        """The tokens `group` adds to a forward: its prompt once (packed) or once per sample."""
        responses = sum(len(s.token_ids) for s in group.samples)
        prompts = len(group.prompt_ids) * (1 if self.cfg.shared_prompt else len(group.samples))
        return prompts + responses

    @property
    def pending(self) -> int:
        return len(self._pending)

    def flush(self, max_groups: int | None = None) -> int:
        """Train what is queued now (the trainer calls this when no other group waits): all of it, or
        the first `max_groups` groups (the rest stays queued, in order). Returns how many trained."""
        if max_groups is None or max_groups >= len(self._pending):
            n = len(self._pending)
            self._flush()
            return n
        n = max(1, max_groups)
        rest = self._pending[n:]
        self._pending = self._pending[:n]
        self._flush()
        self._pending, self._pending_tokens = rest, sum(self._cost(g) for g in rest)
        return n

    def _flush(self) -> None:
        """Forward/backward the queued groups as one micro-batch; the summed loss adds to .grad."""
        groups, self._pending, self._pending_tokens = self._pending, [], 0
        if not groups:
            return
        if self.impl == "gpu":
            self._flush_device(groups)
        else:
            self._flush_cpu(groups)

    def _flush_cpu(self, groups: list[Group]) -> None:
        """The cpu impl's micro-batch (packing.collate: block attention for long rows)."""
        pairs = [(g.prompt_ids, [s.token_ids for s in g.samples]) for g in groups]
        samples = [s for g in groups for s in g.samples]
        keep_s = torch.tensor([s.finished or not self.cfg.mask_truncated_completions for s in samples])  # [S]
        self.norm.sequences += int(keep_s.sum())
        self.norm.samples += len(samples)
        batch = collate(pairs, self.cfg.shared_prompt).to(self.device)
        if batch.targets.numel() == 0:
            return
        adv = torch.cat([self._advantages(g) for g in groups])  # [S]
        context = response_contexts(pairs) if self.tri.transform.penalised else None  # [N, C]
        with self._autocast():
            old = self._old_logprobs(batch, context)  # [N] or None (the policy's own)
            out = self.tri(batch, old, context=context, with_entropy=self.cfg.entropy_coef > 0, measure_entropy=True)
        model_tokens = loss_mask(groups).to(self.device) > 0  # [N] False on environment tokens (multi-turn)
        keep = keep_s.to(self.device)[batch.sample_index] & model_tokens  # [N]
        adv_tok = adv.to(self.device, out.policy.dtype)[batch.sample_index]  # [N]
        engine = engine_logprobs(groups)  # [N] NaN where the engine gave none
        is_w, rho, corrected = engine_is_weights(out.old, engine, self.cfg.is_correction, self.cfg.is_cap)  # [N] x 3
        per_token, ratio, clipped = self._token_losses(
            out, adv_tok, batch.sample_index, len(samples), is_w.to(out.policy)
        )  # [N] x 3
        weights = token_weights(self.cfg.loss_type, keep, batch.sample_index, len(samples)).to(per_token)  # [N]
        loss = (weights * per_token).sum()
        loss.backward()
        self.norm.tokens += int(keep.sum())
        self._record(groups, out, keep, int(model_tokens.sum()), per_token, ratio, clipped, adv_tok)
        if self.first_pass:  # the same ratios on every pass (old = the epoch-start policy)
            self.stats.add_is(rho[keep].cpu(), corrected[keep].cpu())

    def _group_rewards(self, group: Group) -> tuple[list[float], int]:
        """(the rewards `group`'s advantages are scaled over, the index of its first sample among them):
        its own from 0 here; a rank's piece of a group, the whole group's (RankLearner)."""
        return [s.reward for s in group.samples], 0

    def _advantages(self, group: Group) -> torch.Tensor:
        """[G] float64: the advantages of `group`'s samples under trainer.scale_rewards."""
        rewards, first = self._group_rewards(group)
        whole = scaled_advantages(torch.tensor(rewards, dtype=torch.float64), self.cfg.scale_rewards, self.batch_std)
        return whole[first : first + len(group.samples)]

    def _advantage_values(self, group: Group) -> list[float]:
        """`_advantages` as Python floats, computed on the host (the gpu impl: no torch op per group)."""
        rewards, first = self._group_rewards(group)
        scaled = host_advantages(rewards, self.cfg.scale_rewards, self.batch_std)
        return scaled[first : first + len(group.samples)]

    def _fold_stats(self) -> None:
        """Bring the gpu impl's device-side metrics into `stats` (one host read; nothing on the cpu impl)."""
        self.device_stats.fold(self.stats)

    def _old_logprobs(self, batch: ModelBatch, context: torch.Tensor | None) -> torch.Tensor | None:
        """[N] the epoch-start policy's log-probs: None (the policy's own, detached) before the
        epoch's first optimizer step, after it the frozen copy's."""
        if self.epoch_steps == 0 or self.frozen is None:
            return None
        with torch.no_grad():
            return response_logprobs(self.frozen, batch, self.tri.transform, context=context)

    def _token_losses(
        self,
        out: TriLogprobs,
        adv: torch.Tensor,
        sample_index: torch.Tensor,
        n_samples: int,
        is_weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss_t [N], importance ratio [N] detached, clipped [N] bool) under the loss type.
        `is_weight` ([N], detached: losses.engine_is_weights) multiplies the policy-gradient term
        only (as TRL: the KL and entropy terms are regularisers of the current policy)."""
        c = self.cfg
        lr_ = log_ratio(out.policy, out.old, c.ratio_level(), sample_index, n_samples)  # [N]
        if c.loss_type == "cispo":
            pg, clipped = cispo_loss(out.policy, out.old, adv, c.eps_low, c.eps_high)
        else:
            pg, clipped = ppo_clip_loss(out.policy, out.old, adv, c.eps_low, c.eps_high, c.delta, lr_)
        loss = pg if is_weight is None else pg * is_weight
        if out.ref is not None:
            loss = loss + c.beta * kl_estimate(out.policy, out.ref, c.kl_estimator)
        if c.entropy_coef > 0 and out.entropy is not None:
            loss = loss - c.entropy_coef * out.entropy
        return loss, lr_.detach().exp(), clipped

    def _record(
        self,
        groups: list[Group],
        out: TriLogprobs,
        keep: torch.Tensor,
        model_tokens: int,
        per_token: torch.Tensor,
        ratio: torch.Tensor,
        clipped: torch.Tensor,
        adv: torch.Tensor,
    ) -> None:
        """Epoch stats of one micro-batch (plain floats): loss, KL, ratio, clipping (and its low and
        high sides: adv [N], each token's advantage) and entropy over the tokens that enter the loss
        (keep: [N] bool); `tokens` counts the model's tokens."""
        self.stats.trained_tokens += int(keep.sum())
        self.stats.loss_sum += float(per_token.detach()[keep].sum())
        if out.ref is not None:
            kl = kl_estimate(out.policy.detach(), out.ref, self.cfg.kl_estimator)  # [N]
            self.stats.kl_sum += float(kl[keep].sum())
        self.stats.clipped += int((clipped & keep).sum())
        low, high = clip_sides(ratio, adv, self.cfg.eps_low, self.cfg.eps_high)  # [N] x 2
        self.stats.clipped_low += int((low & keep).sum())
        self.stats.clipped_high += int((high & keep).sum())
        if out.entropy is not None:
            self.stats.entropy_sum += float(out.entropy.detach()[keep].sum())
            self.stats.entropy_tokens += int(keep.sum())
        self.stats.add_ratio(ratio[keep])
        if self.first_pass:
            self.stats.tokens += model_tokens
            self.stats.add_logprob_diff(engine_logprobs(groups), out.old)

    def step(self) -> dict[str, float]:
        """The epoch's remaining optimizer steps (the first pass from the open minibatch on, then
        passes 2..mu), then version += 1: one published version per epoch."""
        if self.run.gated:
            self._open_gate()
        self._optimizer_step()
        for k in range(self.run.open + 1, self.run.plan.minibatches):
            self._train_minibatch(k)
        self.first_pass = False
        for _ in range(1, self.cfg.num_iterations):
            for k in range(self.run.plan.minibatches):
                self._train_minibatch(k)
        lr = epoch_lr(self.cfg, self.version, self.horizon)  # this epoch's
        self.version += 1
        self._sync_reference()
        self._fold_stats()
        metrics = self.stats.metrics()
        grad_norm = self.stats.grad_norm_sum / max(self.stats.steps, 1)
        metrics.update(grad_norm=grad_norm, version=float(self.version), lr=lr)
        self._reset_epoch(0)  # the next epoch starts clean even without begin_epoch
        return metrics

    def _train_minibatch(self, k: int) -> None:
        for g in self.run.held[k]:
            self._queue(g)
        self._optimizer_step()

    def _optimizer_step(self) -> None:
        """Flush, scale gradients by 1 / (the minibatch's normaliser), clip, step once (no version)."""
        self._flush()
        self._synchronise()
        params = [p for p in self.policy.parameters() if p.requires_grad]
        n = self.norm
        scale = 1.0 / normaliser(self.cfg.loss_type, n.tokens, n.sequences, n.samples, self.max_new_tokens)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scale)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        for group in self.optimizer.param_groups:
            group["lr"] = epoch_lr(self.cfg, self.version, self.horizon)
        if self.epoch_steps == 0 and self.frozen is not None:  # the epoch-start weights, for the later steps
            self.frozen.load_state_dict(self.policy.state_dict())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.norm = Norm()
        self.epoch_steps += 1
        self.stats.steps += 1
        if self.impl == "gpu":  # read with the other metrics (_fold_stats), no sync here
            self.device_stats.add(self.device, grad_norm_sum=grad_norm)
        else:
            self.stats.grad_norm_sum += float(grad_norm)

    def _sync_reference(self) -> None:
        """trainer.ref_sync_epochs: every N versions, reference = alpha * policy + (1 - alpha) * reference."""
        every, ref = self.cfg.ref_sync_epochs, self.tri.reference
        if not every or ref is None or self.version % every:
            return
        alpha = self.cfg.ref_mixup_alpha
        with torch.no_grad():
            for r, p in zip(ref.parameters(), self.policy.parameters(), strict=True):
                r.mul_(1.0 - alpha).add_(p.detach().to(r.dtype), alpha=alpha)

    def _synchronise(self) -> None:
        """Before the scaling: make the gradients and `stats` the whole epoch's. One process holds
        them already; a distributed rank (trainer/rank_learner.py) sums them over its group."""

    def weights(self) -> dict[str, torch.Tensor]:
        """A CPU snapshot (copies) of the policy's named tensors, floating ones cast to model.dtype
        (the engines' dtype): safe to serialise while training. With LoRA: the adapter only."""
        if self.lora is not None:
            return lora.published(self.policy, self.lora, self.base_fingerprint, self.dtype)
        return {name: published(t, self.dtype) for name, t in self.policy.state_dict().items()}

    def save_checkpoint(self, path: Path) -> None:
        merged = self.lora is not None and self.lora.export_merged
        extra = self._extra_state()
        checkpoint.save(Path(path), self.policy, self.optimizer, self.version, self.model_dir, merged, extra)
        position.save(Path(path), self.data_identity, self.version)

    def _extra_state(self) -> dict[str, object]:
        """What a resume needs beyond weights and optimizer: the lr schedule's horizon, and the
        reference when ref_sync_epochs moves it."""
        extra: dict[str, object] = {"lr_horizon": self.horizon}
        if self.cfg.ref_sync_epochs and self.tri.reference is not None:
            extra["reference"] = self.tri.reference.state_dict()
        return extra

    def load_checkpoint(self, path: Path) -> None:
        self.version = checkpoint.load(Path(path), self.policy, self.optimizer)
        extra = checkpoint.extra_state(Path(path))
        self.horizon = int(extra.get("lr_horizon", self.horizon))
        if "reference" in extra and self.tri.reference is not None:
            self.tri.reference.load_state_dict(extra["reference"])


def published(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A host copy of the tensor `t` as workers get it: floating point in the run's `dtype`."""
    return t.detach().to("cpu", dtype=dtype if t.is_floating_point() else t.dtype, copy=True)


def epoch_lr(c: TrainerSection, version: int, horizon: int) -> float:
    """The learning rate of the epoch that trains `version`: trainer.lr under its scheduler."""
    return c.lr * lr_factor(c.lr_scheduler, version, c.warmup_epochs, horizon)
