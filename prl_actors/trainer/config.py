"""The `trainer:` section (the learner, its recipe, micro-batches, ranks) and `trainer.lora:`.

A section lives beside the code that reads it; prl_actors/config.py composes every section into the
run's `Config` and holds the rules that span sections (docs/CONFIG.md lists every field)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from prl_actors.sections import Section, Threads

LORA_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")


class LoraSection(Section):
    """LoRA on the policy (peft): only the adapter trains and travels to the workers (docs/LORA.md)."""

    r: int = Field(16, ge=1, le=1024, description="Adapter rank.")
    alpha: float = Field(32.0, gt=0, description="LoRA alpha: the update is (alpha / r) * B @ A.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Names (or name suffixes) of the linear layers to adapt, e.g. q_proj, v_proj, gate_proj.",
    )
    dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout on the adapter's input while training (0: deterministic updates)."
    )
    export_merged: bool = Field(
        False, description="Also write a merged plain HF model into each checkpoint (CKPT/merged)."
    )

    @model_validator(mode="after")
    def _targets(self) -> LoraSection:
        bad = [t for t in self.target_modules if not LORA_TARGET.fullmatch(t)]
        if not self.target_modules or bad:
            raise ValueError(
                f"target_modules must list module names such as q_proj or mlp.down_proj, got {self.target_modules!r}"
            )
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ValueError(f"target_modules lists a name twice: {self.target_modules!r}")
        return self


CPU_MICRO_BATCH_TOKENS = 2048


class TrainerSection(Section):
    threads: Threads = Field(
        "auto",
        description="torch CPU threads in the trainer process. auto: under `up`, this host's usable cores "
        "are split between the trainer (half) and the local workers (the rest, evenly, at least 1 each) "
        "while they generate. For a model of 1M parameters or more the cores are handed over: the only "
        "local worker takes every core from the epoch's weights until it sends its first group, and the "
        "trainer takes every core once the epoch is generated (docs/ARCHITECTURE.md). An actor started "
        "on its own takes every core.",
    )
    learner: Literal["grpo", "sim"] = Field("grpo")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate (1e-3 suits the built-in tiny model).")
    eps_low: float = Field(0.2, ge=0, description="PPO clip: ratio >= 1 - eps_low.")
    eps_high: float = Field(0.2, ge=0, description="PPO clip: ratio <= 1 + eps_high.")
    beta: float = Field(0.0, ge=0, description="KL(policy || reference) weight (k3 estimator).")
    max_grad_norm: float = Field(1.0, gt=0)
    micro_batch_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="Token budget of one forward/backward micro-batch (packed tokens: a group's prompt once plus "
        "its responses). Groups that arrive while the trainer is busy are trained together up to this budget. "
        f"auto: {CPU_MICRO_BATCH_TOKENS} on the CPU; with trainer.impl gpu on an accelerator, the tokens whose "
        "activations fit in the device's free memory (model/memory.py: token_budget).",
    )
    impl: Literal["auto", "cpu", "gpu"] = Field(
        "auto",
        description="The training path. cpu: bucketed block attention, per-micro-batch metrics read on the host "
        "(fastest on CPU); gpu: packed rows under one block mask, log-probs in vocabulary chunks, metrics kept on "
        "the device and read once per step (a constant number of kernels and host syncs per micro-batch: "
        "docs/LEARNING.md). auto: gpu on a cuda / npu device, cpu on the CPU. Both give the same update.",
    )
    micro_batch_groups: int = Field(256, ge=1, description="At most this many groups in one micro-batch.")
    shared_prompt: bool = Field(True, description="Pack a group as [prompt | r1..rG] with a shared mask.")
    credits: int = Field(32, ge=1, description="Groups the trainer lets the buffer send ahead.")
    checkpoint_every: int = Field(1, ge=0, description="Checkpoint every N epochs (0 = never).")
    keep_checkpoints: int = Field(
        2,
        ge=0,
        description="Keep the newest N checkpoints (0 = keep all) and the best by evaluation; the final one is "
        "always kept. Only the newest holds the optimizer's state.",
    )
    device: str = Field("cpu", description="cpu, cuda or cuda:N (with world_size > 1: each rank cuda:LOCAL_RANK).")
    lora: LoraSection | None = Field(
        None, description="LoRA (r, alpha, target_modules, dropout); absent or null = full fine-tuning."
    )
    world_size: int = Field(
        1,
        ge=1,
        description="Trainer ranks (torch.distributed); the trainer actor is rank 0 and starts the others on "
        "its host, or joins a torchrun launch (docs/DISTRIBUTED.md).",
    )
    strategy: Literal["single", "ddp", "fsdp2"] = Field(
        "single",
        description="single: one process; ddp: replicas, gradients all-reduced once per step; fsdp2: "
        "parameters, gradients and optimizer state sharded (fully_shard).",
    )
    on_nonfinite: Literal["fail", "skip"] = Field(
        "fail",
        description="A non-finite loss or gradient norm never reaches the optimizer: fail = the trainer "
        "fails the run naming the epoch and cause (no weights are published or checkpointed); skip = the "
        "epoch's step is skipped (weights unchanged, the version still advances) and counted.",
    )
    no_signal_epochs: int = Field(
        3,
        ge=1,
        description="After this many epochs in a row in which every group had equal rewards (zero "
        "advantage: nothing is learned), the trainer says so in one clear console line.",
    )
    dist_timeout_s: float = Field(
        120.0,
        gt=0,
        description="A collective or command that a rank does not join within this fails the step (no hang); "
        "a rank whose process dies fails it at once.",
    )
    # --- the GRPO family (docs/LEARNING.md: recipes) -------------------------------------------
    loss_type: Literal["dapo", "grpo", "bnpo", "dr_grpo", "gspo", "cispo"] = Field(
        "dapo",
        description="How per-token losses become the minibatch loss. dapo/bnpo: sum / the minibatch's tokens; "
        "grpo: token mean per sequence, then mean over sequences; dr_grpo: sum / (sequences x max_new_tokens); "
        "gspo: sequence-level ratio (importance_sampling_level sequence), aggregated as grpo; cispo: "
        "REINFORCE weighted by the clipped, detached ratio, aggregated as dapo.",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description="Advantage = reward - group mean, divided by the group's std (group), the whole epoch's "
        "std (batch: training waits until every group of the epoch is in), or nothing (none, as Dr. GRPO).",
    )
    importance_sampling_level: Literal["token", "sequence"] | None = Field(
        None,
        description="token: one ratio per token (PPO); sequence: exp(mean log-ratio of the sequence) for every "
        "token (GSPO). Unset: sequence for loss_type gspo, token otherwise.",
    )
    num_minibatches: int = Field(
        1,
        ge=1,
        description="M: optimizer steps per pass over the epoch's groups; minibatch k holds the groups with "
        "group_id * M // B == k (by index, never by arrival). Must not exceed coordinator.groups_per_epoch.",
    )
    num_iterations: int = Field(
        1, ge=1, description="mu: passes over the epoch's groups (M x mu optimizer steps, one published version)."
    )
    delta: float | None = Field(
        None,
        gt=1,
        description="Two-sided clip (TRL delta, INTELLECT-2): the unclipped PPO term uses min(ratio, delta). "
        "None: off.",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="Per-token KL(policy || reference) estimator weighted by beta: k1 = logp - ref, "
        "k2 = (logp - ref)^2 / 2, k3 = exp(ref - logp) - (ref - logp) - 1.",
    )
    entropy_coef: float = Field(
        0.0, ge=0, description="Entropy bonus: loss -= entropy_coef x the token's entropy (behaviour distribution)."
    )
    ref_sync_epochs: int = Field(
        0,
        ge=0,
        description="Every N epochs the reference becomes ref_mixup_alpha x policy + (1 - alpha) x reference "
        "(TRL sync_ref_model); 0 = the reference stays the initial weights. Needs beta > 0, no LoRA.",
    )
    ref_mixup_alpha: float = Field(0.6, ge=0, le=1, description="Mixing weight of a reference sync.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="Learning rate by epoch (the same for the M x mu steps of an epoch): constant, or linear / "
        "cosine decay to 0 at run.epochs (the horizon is saved in checkpoints, so a resume continues it).",
    )
    warmup_epochs: int = Field(0, ge=0, description="Linear warm-up: epoch e < warmup_epochs uses lr x (e+1)/(W+1).")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward (less memory, ~30% more compute: docs/MEMORY.md)."
    )
    is_correction: Literal["none", "tis", "mis"] = Field(
        "none",
        description="Engine-mismatch correction per token, rho = exp(trainer old log-prob - engine log-prob): "
        "tis multiplies the token's policy-gradient loss by min(rho, is_cap) (truncated IS, Yao et al. 2025); "
        "mis by rho, or 0 where rho > is_cap (masked IS); none: off. Detached weights (docs/LEARNING.md).",
    )
    is_cap: float = Field(
        2.0,
        gt=1,
        description="The cap C > 1 of trainer.is_correction: tis truncates rho at C, mis masks rho > C (at C = 1 "
        "mis would mask on float rounding, rho being 1 +- 1e-7 on-policy).",
    )
    mask_truncated_completions: bool = Field(
        False,
        description="A sample that hit max_new_tokens without finishing (finished = false) contributes no loss "
        "and is not counted by the normaliser (its reward still enters its group's advantages).",
    )

    @model_validator(mode="after")
    def _ranks_need_a_strategy(self) -> TrainerSection:
        if self.world_size > 1 and self.strategy == "single":
            raise ValueError("world_size > 1 needs strategy ddp or fsdp2")
        return self

    @model_validator(mode="after")
    def _recipe_options(self) -> TrainerSection:
        if self.loss_type == "gspo" and self.importance_sampling_level == "token":
            raise ValueError("loss_type gspo is the sequence-level ratio: leave importance_sampling_level unset")
        if self.ref_sync_epochs and (self.beta == 0 or self.lora is not None):
            raise ValueError("ref_sync_epochs needs beta > 0 and no LoRA (a reference model of its own to mix)")
        if self.strategy != "single" and (unsupported := distributed_refused(self)):
            raise ValueError(f"strategy {self.strategy} does not support {unsupported} yet: use strategy single")
        return self

    def ratio_level(self) -> str:
        """token or sequence: the importance-sampling level in force."""
        if self.importance_sampling_level is not None:
            return self.importance_sampling_level
        return "sequence" if self.loss_type == "gspo" else "token"

    def fixed_micro_batch_tokens(self) -> int:
        """micro_batch_tokens where no memory budget applies: the value set, or auto's CPU default."""
        return CPU_MICRO_BATCH_TOKENS if self.micro_batch_tokens == "auto" else self.micro_batch_tokens


def distributed_refused(t: TrainerSection) -> str:
    """The recipe options a trainer rank group cannot run yet ('' if none): ranks train shares of a
    round (trainer/rank_learner.py), not minibatches by group index, and hold no frozen old policy."""
    bad = [
        name
        for name, on in (
            ("trainer.num_minibatches > 1", t.num_minibatches > 1),
            ("trainer.num_iterations > 1", t.num_iterations > 1),
            ("trainer.scale_rewards batch", t.scale_rewards == "batch"),
            ("trainer.ref_sync_epochs", t.ref_sync_epochs > 0),
            ("trainer.gradient_checkpointing", t.gradient_checkpointing),
        )
        if on
    ]
    return ", ".join(bad)
