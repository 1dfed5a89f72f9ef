"""GRPO learner: group-normalised advantages, PPO-clip + k3 KL, one optimizer step per epoch.

Invariants:
* `accumulate` only adds gradients (never steps); `step` steps exactly once and bumps `version` by 1.
* The loss is a *sum* over response tokens during accumulation; `step` divides the summed gradients
  by the epoch's total response-token count, so the update is the same whatever order (and whatever
  micro-batching) the groups arrived in, up to float summation order.
* Groups are trained in arrival order, in micro-batches: `accumulate` queues, and the queue is trained
  once it holds `trainer.micro_batch_tokens` packed tokens (or `micro_batch_groups` groups), or when
  the trainer calls `flush` because nothing else waits (`step` flushes the rest first).
* Strict on-policy: old log-probs are the policy's own, detached (see trimodel.py), so the ratio is
  exactly 1 and clipping never activates (clip_frac is 0). Tokens are scored under the behaviour
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
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from transformers import PreTrainedModel

from prl_actors.config import GREEDY_REFUSED, Config, ConfigError
from prl_actors.data import position
from prl_actors.model.builtin import load_model
from prl_actors.model.device import resolve_device, resolve_dtype
from prl_actors.model.lora import base_fingerprint
from prl_actors.protocol.messages import Group
from prl_actors.tasks.registry import data_identity
from prl_actors.training import checkpoint, lora
from prl_actors.training.behaviour import Behaviour, response_contexts
from prl_actors.training.losses import group_advantages, k3_kl, ppo_clip_loss
from prl_actors.training.packing import collate
from prl_actors.training.trimodel import TriModel


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
    clipped: int = 0
    diff_tokens: int = 0
    diff_sum: float = 0.0
    diff_max: float = 0.0

    def add_rewards(self, rewards: list[float]) -> None:
        self.groups += 1
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

    def metrics(self) -> dict[str, float]:
        tokens, samples = max(self.tokens, 1), max(self.samples, 1)
        return {
            "reward_mean": self.reward_sum / samples,
            "accuracy": self.correct / samples,
            "loss": self.loss_sum / tokens,
            "kl": self.kl_sum / tokens,
            "clip_frac": self.clipped / tokens,
            "logprob_diff_max": self._diff(self.diff_max),
            "logprob_diff_mean": self._diff(self.diff_sum / max(self.diff_tokens, 1)),
            "tokens": float(self.tokens),
            "samples": float(self.samples),
            "groups": float(self.groups),
            "response_len": self.tokens / samples,
        }

    def _diff(self, value: float) -> float:
        """NaN when tokens were trained but no engine log-prob came with them (nothing measured)."""
        return float("nan") if self.tokens and not self.diff_tokens else value


def adamw(params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """AdamW, fused where the parameters' device has the fused kernel (CPU and CUDA: one kernel for
    every tensor instead of a loop of small ops; 2-3x faster steps on CPU), else the default."""
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True)
    except (RuntimeError, ValueError):  # a device (or tensor type) without the fused kernel
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


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


class GRPOLearner:
    """Learner protocol on a local HF model directory (the initial weights are also the reference)."""

    def __init__(self, cfg: Config, model_dir: Path | str | None) -> None:
        if model_dir is None:
            raise ConfigError("the grpo learner needs a model directory (prepare_model)")
        self.cfg = cfg.trainer
        self.model_dir = Path(model_dir)
        sampling = cfg.worker.sampling
        if sampling.temperature == 0:
            raise ConfigError(GREEDY_REFUSED)
        self.device = resolve_device(cfg.trainer.device)
        self.dtype = resolve_dtype(cfg.model.dtype)  # compute dtype, and the dtype workers get
        master = torch.promote_types(self.dtype, torch.float32)
        self.lora = cfg.trainer.lora
        if self.lora is None:
            policy = load_model(model_dir, self.device, master)
        else:  # the frozen base in the compute dtype, the adapter in the master dtype
            policy = lora.wrap(
                load_model(model_dir, self.device, self.dtype), self.lora, master, self.model_dir, cfg.run.seed
            )
        self.base_fingerprint = base_fingerprint(self.model_dir) if self.lora is not None else ""
        self.tri = TriModel(policy, cfg.trainer.beta > 0, Behaviour.of(sampling))
        trained = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = adamw(trained, cfg.trainer.lr)
        self.version = 0
        self.epoch = -1
        self.stats = EpochStats()
        self._pending: list[Group] = []
        self._pending_tokens = 0
        self.data_identity = data_identity(cfg)  # recorded with each checkpoint (data/position.py)

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
        self.stats = EpochStats()
        self._pending, self._pending_tokens = [], 0
        self.optimizer.zero_grad(set_to_none=True)

    def accumulate(self, group: Group) -> dict[str, float]:
        """Queue `group`; run forward/backward once the queue fills a micro-batch (tokens or groups)."""
        rewards = [s.reward for s in group.samples]
        self.stats.add_rewards(rewards)
        self._pending.append(group)
        self._pending_tokens += self._cost(group)
        if self._pending_tokens >= self.cfg.micro_batch_tokens or len(self._pending) >= self.cfg.micro_batch_groups:
            self._flush()
        tokens = sum(len(s.token_ids) for s in group.samples)
        return {"reward_mean": sum(rewards) / max(len(rewards), 1), "tokens": float(tokens)}

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
        pairs = [(g.prompt_ids, [s.token_ids for s in g.samples]) for g in groups]
        batch = collate(pairs, self.cfg.shared_prompt).to(self.device)
        if batch.targets.numel() == 0:
            return
        rewards = [torch.tensor([s.reward for s in g.samples], dtype=torch.float64) for g in groups]
        adv = torch.cat([group_advantages(r) for r in rewards])  # [S]
        context = response_contexts(pairs) if self.tri.transform.penalised else None  # [N, C]
        with self._autocast():
            out = self.tri(batch, context=context)
        adv_tok = adv.to(self.device, out.policy.dtype)[batch.sample_index]  # [N]
        mask = loss_mask(groups).to(self.device, out.policy.dtype)  # [N] 0 on environment tokens
        pg, clipped = ppo_clip_loss(out.policy, out.old, adv_tok, self.cfg.eps_low, self.cfg.eps_high)  # [N]
        kl = k3_kl(out.policy, out.ref) if out.ref is not None else torch.zeros_like(pg)  # [N]
        loss = ((pg + self.cfg.beta * kl) * mask).sum()
        loss.backward()
        self.stats.tokens += int(mask.sum())  # model tokens only: the normaliser of the epoch's gradient
        self.stats.loss_sum += float(loss.detach())
        self.stats.kl_sum += float((kl.detach() * mask).sum())
        self.stats.clipped += int((clipped * mask.bool()).sum())
        self.stats.add_logprob_diff(engine_logprobs(groups), out.old)

    def step(self) -> dict[str, float]:
        """Flush, scale gradients by 1 / (epoch's response tokens), clip, step once, version += 1."""
        self._flush()
        self._synchronise()
        params = [p for p in self.policy.parameters() if p.requires_grad]
        scale = 1.0 / max(self.stats.tokens, 1)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scale)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        metrics = self.stats.metrics()
        metrics.update(grad_norm=float(grad_norm), version=float(self.version))
        self.stats = EpochStats()  # the next epoch starts clean even without begin_epoch
        return metrics

    def _synchronise(self) -> None:
        """Before the scaling: make the gradients and `stats` the whole epoch's. One process holds
        them already; a distributed rank (training/rank_learner.py) sums them over its group."""

    def weights(self) -> dict[str, torch.Tensor]:
        """A CPU snapshot (copies) of the policy's named tensors, floating ones cast to model.dtype
        (the engines' dtype): safe to serialise while training. With LoRA: the adapter only."""
        if self.lora is not None:
            return lora.published(self.policy, self.lora, self.base_fingerprint, self.dtype)
        return {name: self._published(t) for name, t in self.policy.state_dict().items()}

    def _published(self, t: torch.Tensor) -> torch.Tensor:
        dtype = self.dtype if t.is_floating_point() else t.dtype
        return t.detach().to("cpu", dtype=dtype, copy=True)

    def save_checkpoint(self, path: Path) -> None:
        merged = self.lora is not None and self.lora.export_merged
        checkpoint.save(Path(path), self.policy, self.optimizer, self.version, self.model_dir, merged)
        position.save(Path(path), self.data_identity, self.version)

    def load_checkpoint(self, path: Path) -> None:
        self.version = checkpoint.load(Path(path), self.policy, self.optimizer)
