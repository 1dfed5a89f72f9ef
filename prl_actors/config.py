"""Typed, nested run configuration: one section per actor, validated; the CLI only overrides it.

The resolved config is written to RUN_DIR/config.yaml. `load_config` turns every user mistake into a
`ConfigError` with one readable line per problem (never a traceback).
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from prl_actors.classic.envkit.settings import EnvSection
from prl_actors.protocol.messages import ADDRESSED_ROLES, BINDING_ROLES, Role
from prl_actors.sections import ConfigError, Section

ROLES = tuple(r.value for r in ADDRESSED_ROLES)  # the roles with an address; index = tcp port offset (Role.port_offset)
BINDS = tuple(r.value for r in BINDING_ROLES)  # the roles that bind a socket (learner: classic RL only)
LOOPBACK_NAMES = ("localhost", "ip6-localhost")
VLLM_DTYPES = ("float32", "bfloat16")
DEFAULT_BASE_PORT = 27500
LORA_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")

# What `up --resume` may change: where and how fast the run goes, never what it trains. A field is
# safe when every epoch trained under the new value is the epoch the old value would have trained
# (up to float summation order); a prefix ending in "." covers a section.
SAFE_ON_RESUME = (
    "run.name",
    "run.epochs",
    "run.workers",
    "run.max_workers",
    "run.run_dir",
    "run.resume",
    "run.stop_grace_s",
    "run.worker_restarts",
    "run.max_restarts",
    "run.standby_core",
    "run.fork_server",
    "transport.",
    "coordinator.heartbeat_interval_s",
    "coordinator.heartbeat_timeout_s",
    "coordinator.max_groups_per_request",
    "worker.prefetch",
    "worker.threads",
    "worker.device",
    "worker.impl",  # the same tokens either way, up to float noise (docs/ENGINES.md)
    "worker.weight_fetch_timeout_s",
    "buffer.",
    "trainer.threads",
    "trainer.device",
    "trainer.world_size",
    "trainer.dist_timeout_s",
    "worker.shm",
    "worker.tensor_parallel_size",
    "trainer.credits",
    "trainer.checkpoint_every",
    "trainer.gradient_checkpointing",  # recomputes the same forward: the same update
    "trainer.impl",  # the same update either way, up to float summation order (docs/LEARNING.md)
    "trainer.micro_batch_tokens",  # micro-batching does not change the update (periodic == sync)
    "publisher.",
    "eval.",  # evaluation never trains (docs/OBSERVE.md)
    "run.log_completions",
    "run.report_to",
    "trainer.keep_checkpoints",
)


Threads = Annotated[int, Field(ge=1)] | Literal["auto"]


GREEDY_REFUSED = (
    "worker.sampling.temperature 0 (greedy) cannot be trained with GRPO: every sample of a group would "
    "be the same, so every advantage is 0 and nothing is learned; use a temperature > 0 (e.g. 1.0)"
)


class RunSection(Section):
    name: str = Field("run", description="A label for the run (logs, metrics).")
    seed: int = Field(0, description="Seeds prompts, sampling and model init.")
    epochs: int = Field(
        5,
        ge=1,
        description="Number of iteration-epochs. An epoch generates coordinator.groups_per_epoch groups and "
        "publishes one new weight version; it takes one optimizer step, or trainer.num_minibatches x "
        "trainer.num_iterations steps (e.g. DAPO's recipe: 16).",
    )
    mode: Literal["periodic", "sync", "bounded"] = Field(
        "periodic",
        description="periodic: train groups as they arrive; sync: wait for the whole batch; bounded: as periodic, "
        "but epoch e+1 is generated with weights up to run.max_staleness versions old while epoch e trains "
        "(off-policy, corrected by trainer.is_correction: tis unless given when max_staleness > 0; "
        "docs/LEARNING.md).",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="run.mode bounded: k, the most versions a trained sample's weights may lag its epoch's "
        "(v_{e-j}, j <= k; protocol/versions.py within_bound); 0 = on-policy.",
    )
    workers: int = Field(2, ge=0, description="Inference workers `up` starts.")
    max_workers: int = Field(64, ge=0, description="Upper bound of `prl-actors scale` (more is refused).")
    run_dir: str = Field("runs/latest", description="Where logs, metrics, checkpoints go.")
    resume: bool = Field(False, description="Continue from the last checkpoint in run_dir.")
    stop_grace_s: float = Field(
        5.0,
        gt=0,
        description="Stopping: how long `up` waits for actors to exit after a stop request and again "
        "after SIGTERM (then SIGKILL); how long an actor waits for its own thread after a signal.",
    )
    log_completions: int = Field(
        0, ge=0, description="Write this many trained samples per epoch to RUN_DIR/completions.jsonl (0 = none)."
    )
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        [],
        description="Trackers `up` feeds from metrics.jsonl in one thread (wandb offline, mlflow to RUN_DIR/mlruns).",
    )
    worker_restarts: int = Field(
        3,
        ge=0,
        description="A worker that crashes before registering is restarted this many times in a row "
        "(with back-off), then `up` fails with its error.",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        description="Self-healing: a core actor (coordinator, publisher, buffer, trainer) that crashes once the "
        "run is up (killed by a signal, or exited without a reason of its own) makes `up` restart the core from "
        "the last intact checkpoint, the workers staying up and rejoining; at most this many times in a run, "
        "then `up` fails as with 0 (today's behaviour: a core actor's crash ends the run). docs/ARCHITECTURE.md.",
    )
    standby_core: bool = Field(
        False,
        description="Self-healing: keep a spare core (four processes, their imports done, nothing built, bound "
        "or logged) that a core restart takes instead of starting new processes. With run.fork_server (the "
        "default) new processes are forks that skip the imports too, and a spare saves little (recovery 0.8 vs "
        "0.9 s, `prl-actors bench --only heal`); without it a spare skips ~3 s of imports on 2 busy cores. It "
        "costs four idle processes with torch imported (~0.3 GB each); a new spare starts after each restart.",
    )
    fork_server: bool = Field(
        True,
        description="`up` starts its local actors from one fork server that has imported torch, transformers "
        "and the actors once (prl_actors/launch/zygote.py), instead of one new interpreter per actor importing them "
        "again: a faster start on few cores (measured by `prl-actors bench --only startup`). false: one "
        "`python -m prl_actors.cli.main actor ...` process per actor.",
    )
    max_bad_groups: int = Field(
        3,
        ge=1,
        description="A worker whose groups the buffer or trainer refused this many times (bad content: "
        "non-finite numbers, tokens outside the vocabulary, over-long responses, another prompt, wrong "
        "size, rewards that do not re-score) is expelled for the run: its work is requeued and its name "
        "and key are refused from then on (docs/SECURITY.md).",
    )
    max_group_failures: int = Field(
        3,
        ge=1,
        description="A group whose generation or scoring failed this many times (a worker gave it back "
        "with an exception), or that the trainer could not train this many times (its forward/backward "
        "failed on it alone), is given up: see task.on_error.",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_tracker(cls, data: Any) -> Any:
        """report_to: tensorboard (a YAML scalar, a dict from Python) reads as [tensorboard]; a,b as [a, b]."""
        if isinstance(data, dict) and isinstance(data.get("report_to"), str):
            data = {**data, "report_to": [t.strip() for t in data["report_to"].split(",") if t.strip()]}
        return data

    def staleness_bound(self) -> int:
        """k in force: max_staleness under mode bounded, 0 (strict on-policy) otherwise."""
        return self.max_staleness if self.mode == "bounded" else 0


class TransportSection(Section):
    kind: Literal["inproc", "ipc", "tcp"] = Field("tcp", description="ZeroMQ transport for every actor.")
    host: str = Field("127.0.0.1", description="tcp: the host actors bind to and connect to.")
    base_port: int | None = Field(
        None,
        ge=1024,
        le=65500,
        description="tcp: coordinator=base, publisher=+1, buffer=+2, trainer=+3 (learner=+5, classic RL). "
        "Not set: `up` picks the first free set from 27500 up and writes it to RUN_DIR/config.yaml; other "
        "commands use 27500.",
    )
    addresses: dict[str, str] = Field(
        default_factory=dict, description="Explicit per-role addresses (override the derived ones)."
    )
    bind_all: bool = Field(False, description="tcp: bind on all interfaces (*), e.g. in containers.")
    request_timeout_s: float = Field(10.0, gt=0, description="Any request without reply fails after this.")
    auth: Literal["curve", "none"] = Field(
        "curve",
        description="curve: every tcp/ipc socket is authenticated and encrypted with the run's keys "
        "(docs/SECURITY.md); none: any process that reaches a port is trusted, allowed only when every "
        "bound address is loopback or ipc (with a warning). inproc (one process) is never authenticated.",
    )
    keys_dir: str | None = Field(None, description="CurveZMQ keys (default RUN_DIR/keys); see `prl-actors keys`.")
    max_message_bytes: int = Field(
        0,
        ge=0,
        description="Largest control frame a socket accepts (ZMQ_MAXMSGSIZE; a bigger one disconnects the "
        "peer); 0 = derived from worker.group_size and sampling.max_new_tokens. Weight sockets accept "
        "publisher.chunk_bytes + 64 KiB.",
    )
    join_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A member gives up (exits with an error) when the coordinator does not answer its "
        "register, or says nothing at all once it joined, for this long. Also how long a run whose every "
        "worker was expelled (run.max_bad_groups) waits for another to join before it fails.",
    )


class CoordinatorSection(Section):
    groups_per_epoch: int = Field(8, ge=1, description="B: prompts (groups) per epoch.")
    heartbeat_interval_s: float = Field(0.2, gt=0, description="How often members heartbeat.")
    heartbeat_timeout_s: float = Field(2.0, gt=0, description="Silent this long = gone; its work is requeued.")
    max_groups_per_request: int = Field(
        64, ge=1, description="Upper bound of groups handed out per pull (also bounded by a fair share of the queue)."
    )
    hold_factor: float = Field(
        10.0,
        gt=1,
        description="An assignment's deadline: a group held longer than hold_factor x the p95 of the run's "
        "observed group times (at least hold_min_s; hold_factor x hold_min_s before any group was timed) is "
        "taken back and requeued, even from a live worker.",
    )
    hold_min_s: float = Field(30.0, gt=0, description="The floor of an assignment's deadline (see hold_factor).")
    dynamic_sampling: bool = Field(
        False,
        description="DAPO dynamic sampling: a group whose rewards are all equal is not trained (nor counted in the "
        "loss normaliser), and the epoch hands out more prompts, in rounds, until it has B informative groups "
        "(docs/LEARNING.md).",
    )
    max_sampling_rounds: int = Field(
        4,
        ge=1,
        description="dynamic_sampling: rounds of prompts an epoch may hand out (the first is its B); when they run "
        "out the epoch trains the informative groups it has and says so. An epoch reserves B x this many "
        "positions of the prompt stream.",
    )

    @model_validator(mode="after")
    def _timeout_after_interval(self) -> CoordinatorSection:
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ValueError("heartbeat_timeout_s must exceed 2 x heartbeat_interval_s")
        return self


class SamplingSection(Section):
    temperature: float = Field(
        1.0, ge=0, description="Sampling temperature; 0 = greedy (refused for GRPO training: no group variance)."
    )
    top_p: float = Field(
        1.0, gt=0, le=1, description="Nucleus: sample from the smallest set of tokens with mass >= top_p."
    )
    max_new_tokens: int = Field(8, ge=1)
    top_k: int = Field(
        0, ge=0, description="Sample from the k most likely tokens only (ties at the k-th included); 0 = off."
    )
    min_p: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Drop tokens whose probability (after the temperature) is below min_p x the top token's; 0 = off.",
    )
    repetition_penalty: float = Field(
        1.0,
        gt=0,
        description="HF/vLLM repetition penalty: the logit of every token already in the prompt or the response "
        "so far is divided by it if positive, multiplied if negative (> 1 discourages repeats); 1 = off.",
    )
    stop: list[str] = Field(
        default_factory=list,
        description="Stop strings: a response ends at the first one (its text cut before it, its tokens up to the "
        "one that completed it) and counts as finished.",
    )

    @model_validator(mode="after")
    def _stop_strings(self) -> SamplingSection:
        if any(not x for x in self.stop):
            raise ValueError("stop: stop strings must be non-empty")
        return self


class WorkerSection(Section):
    max_batch_rows: int = Field(
        256,
        ge=1,
        description="Rows (samples) in the running batch (continuous batching; like vLLM's max_num_seqs). "
        "Larger batches generate more tokens/s on CPU and GPU alike; lower it where the KV cache does not "
        "fit (a group of G needs G rows).",
    )
    prefetch: int = Field(
        1, ge=0, le=64, description="Groups to hold queued beyond the running batch, so a freed row never waits."
    )
    threads: Threads = Field("auto", description="torch CPU threads in each worker process; auto: see trainer.threads.")
    engine: Literal["torch", "sim", "vllm"] = Field("torch", description="Generation engine.")
    group_size: int = Field(8, ge=1, description="G: samples per prompt.")
    device: str = Field("cpu", description="cpu, cuda, cuda:N or npu (torch engine); vllm: the kind its build runs on.")
    impl: Literal["auto", "cpu", "gpu"] = Field(
        "auto",
        description="torch engine's decode path: gpu = a static KV cache, decode steps of static shapes (CUDA "
        "graphs on CUDA), sampling on the device, one host read per chunk of steps (Qwen2/Llama-shaped models; "
        "others keep cpu, logged once); cpu = the Hugging Face running batch (fastest on CPU); auto = gpu on "
        "cuda/npu, cpu on cpu. docs/ENGINES.md.",
    )
    sampling: SamplingSection = SamplingSection()
    weight_fetch_timeout_s: float = Field(30.0, gt=0)
    gpu_memory_utilization: float = Field(
        0.25,
        gt=0,
        le=1,
        description="vllm: share of the device's memory each worker's vLLM reserves (weights, activations, "
        "KV cache); on vLLM's CPU build the share of RAM. Workers on one host x share must fit.",
    )
    enforce_eager: bool = Field(True, description="vllm: no CUDA graphs / torch.compile (faster start).")
    max_model_len: int | None = Field(
        None, ge=1, description="vllm: context length (prompt + response); None = the model's own."
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="vllm: devices one worker spans (vllm.LLM tensor_parallel_size); weight updates reach "
        "every TP rank through the worker extension. Unverified without GPUs (docs/DISTRIBUTED.md).",
    )
    shm: bool = Field(
        True,
        description="Take weights from the publisher's /dev/shm snapshot when on its host (proved by reading "
        "its host file), else chunked ZeroMQ (docs/PROTOCOL.md).",
    )
    sync_kl_threshold: float | None = Field(
        None,
        ge=0,
        description="run.mode bounded (k >= 1): a worker loads newer weights before the floor forces it once "
        "its estimated KL(held || newest published) exceeds this (AAPS applied to LLM workers; 0 = every new "
        "version; None = only when its weights fall below the epoch's floor). docs/LEARNING.md.",
    )


class BufferSection(Section):
    max_groups: int = Field(4096, ge=1, description="Bound on groups held; over it, groups are refused.")
    verify_rewards: bool = Field(
        False,
        description="Re-score every group's texts with the task's reward in the buffer and refuse a group "
        "whose reported rewards differ (reason reward_mismatch): for workers on hosts you do not fully "
        "trust. Costs one reward call per sample in the buffer (docs/SECURITY.md).",
    )
    reward_tolerance: float = Field(
        1e-6, ge=0, description="verify_rewards: the largest |reported - re-scored| reward accepted."
    )


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
"""trainer.micro_batch_tokens auto on the CPU (and on a device where the memory budget is not used)."""


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


def bounded_refused(cfg: Config) -> str:
    """Why run.mode bounded cannot run with `cfg` ('' if it can): stale samples need the GRPO learner
    and an importance correction; dynamic sampling and trainer rank groups are not pipelined with it
    yet (evaluation is: the pipeline pauses at an evaluated epoch, coordinator/core.py `_bound`)."""
    if cfg.trainer.learner != "grpo":
        return "needs trainer.learner grpo (stale samples are corrected by the GRPO learner)"
    if cfg.trainer.is_correction == "none" and cfg.run.max_staleness > 0:
        return "trains samples up to run.max_staleness versions old: set trainer.is_correction tis (or mis)"
    if cfg.coordinator.dynamic_sampling:
        return "with coordinator.dynamic_sampling is not supported yet"
    if cfg.trainer.strategy != "single":
        return f"with trainer.strategy {cfg.trainer.strategy} is not supported yet: use strategy single"
    return ""


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


class PublisherSection(Section):
    chunk_bytes: int = Field(4 << 20, ge=1024, description="Weight transfer chunk size.")
    transfer_timeout_s: float = Field(60.0, gt=0)
    shm: bool = Field(
        True,
        description="Write each version once to /dev/shm for workers that prove they share this host "
        "(one copy per host); others get chunks. Off, or /dev/shm too small: chunks for all.",
    )


class ModelSection(Section):
    path: str | None = Field(None, description="Local Hugging Face checkpoint dir; None = built-in tiny LM.")
    hidden_size: int = Field(64, ge=8)
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    warm_start_steps: int = Field(
        600, ge=0, description="Supervised AdamW steps (batch 64) on `add` for the built-in model."
    )
    warm_start_smoothing: float = Field(
        0.3,
        ge=0,
        lt=1,
        description="Label smoothing of the warm start: an under-confident model whose greedy answer is "
        "mostly right but whose temperature-1 samples are right ~30% of the time, so GRPO has room.",
    )
    dtype: Literal["float32", "bfloat16", "float64"] = Field(
        "float32", description="Weights and compute dtype (float64: exactness tests on CPU)."
    )


REWARD_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class RewardSpec(Section):
    """One reward of `task.rewards`: exactly one of `fn`, `model`, `url` (docs/TASKS.md)."""

    fn: str | None = Field(
        None, description="A built-in (math, format, length, add, code) or 'module:function' (per sample or batched)."
    )
    model: str | None = Field(None, description="A local Hugging Face sequence-classification checkpoint directory.")
    url: str | None = Field(None, description="An http(s) reward service (JSON contract in docs/TASKS.md).")
    name: str | None = Field(
        None, description="Metrics key reward/<name> (default: the builtin or function name, 'model', 'service')."
    )
    weight: float = Field(1.0, allow_inf_nan=False, description="Its weight in the total (sum of weight * value).")
    batched: bool = Field(False, description="fn: called once per group with its G records instead of per sample.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments bound to fn (length: max_tokens)."
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="url: seconds per request (default 30); fn: bound on a plugin's (or async reward's) wait per group "
        "(default 300).",
    )
    retries: int = Field(2, ge=0, le=10, description="url: extra attempts after a failed or timed-out request.")
    concurrency: int = Field(4, ge=1, le=256, description="url: requests in flight at once (per worker).")
    device: str = Field("cpu", description="model: torch device of the reward model (cpu, cuda, cuda:1, ...).")
    threads: int | None = Field(None, ge=1, description="model: torch CPU threads while scoring (default: unchanged).")
    batch_size: int = Field(16, ge=1, description="model: sequences per forward pass.")
    max_length: int = Field(1024, ge=8, description="model: prompt+completion tokens kept (truncated from the left).")
    label: int = Field(0, ge=0, description="model: the logit used as the reward (num_labels > 1).")

    @model_validator(mode="after")
    def _one_source(self) -> RewardSpec:
        given = [k for k in ("fn", "model", "url") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"a reward needs exactly one of fn, model, url (got {', '.join(given) or 'none'})")
        if self.batched and not self.fn:
            raise ValueError("batched applies to fn rewards (model and url rewards always score a group at once)")
        if self.args and not self.fn:
            raise ValueError("args applies to fn rewards (keyword arguments bound to the function)")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")
        if self.name is not None and not REWARD_NAME.fullmatch(self.name):
            raise ValueError(f"reward name {self.name!r}: use letters, digits, '_', '.', '-'")
        return self

    def default_name(self) -> str:
        if self.name:
            return self.name
        if self.fn:
            return self.fn.rpartition(":")[2] or self.fn
        return "model" if self.model else "service"


class TaskSection(Section):
    name: str = Field(
        "add",
        description="add (a+b=, the default), jsonl (prompts_file), math (word problems), code (programs vs "
        "tests) or guess (a game).",
    )
    prompts_file: str | None = Field(
        None, description="JSONL or parquet file, or a local `datasets` directory (math: the shipped sample if unset)."
    )
    prompt_field: str | None = Field(
        None, description="Column/key of the prompt (default: jsonl 'prompt', math 'question')."
    )
    answer_field: str = Field("answer", description="Column/key of the reference answer.")
    split: str = Field("train", description="The split to read from a `datasets` directory holding several.")
    chat_template: bool = Field(False, description="Wrap each prompt in the tokenizer's chat template (model.path).")
    system_prompt: str | None = Field(None, description="System message of the chat template (needs chat_template).")
    format_reward: float = Field(
        0.0, ge=0, lt=1, description="math: bonus for a \\boxed{} or #### final answer (added to the 0/1 correctness)."
    )
    reward: str | None = Field(None, description="module:function reward plugin (see docs).")
    on_error: Literal["fail", "skip", "fail_first"] = Field(
        "fail_first",
        description="A group that failed generation, scoring or training run.max_group_failures times: fail = the "
        "run fails naming the prompt and exception; skip = the group is dropped from its epoch (the step "
        "trains the rest; logged and on the console); fail_first = fail while no epoch has been trained "
        "yet (a broken config or plugin is caught at once), skip afterwards.",
    )
    rewards: list[RewardSpec] = Field(
        default_factory=list,
        description="Weighted rewards (fn / model / url), summed by weight; replaces the task's own reward.",
    )
    on_reward_error: Literal["fail", "zero"] = Field(
        "fail",
        description="A reward that raises or returns a non-finite number: fail the run (one line), or score 0, warn.",
    )
    tests_field: str = Field("tests", description="code: column holding the row's tests (a list of Python asserts).")
    code_timeout_s: float = Field(5.0, gt=0, le=600, description="code: seconds a sample's program may run.")
    code_memory_mb: int = Field(512, ge=16, description="code: address-space limit (RLIMIT_AS) of the program.")
    code_unsafe_local: bool = Field(
        False,
        description="code: run programs as plain local subprocesses (rlimits only, no isolation) where bubblewrap "
        "is missing; for trusted code only. Default: refuse to start without bubblewrap (docs/SECURITY.md).",
    )
    max_operand: int = Field(20, ge=1)
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        description="Prompts longer than this (in tokens, after templating) are left out at load, with one line "
        "giving their count and the first one's row; None = no limit. Prompts that cannot fit the model's "
        "positions with max_new_tokens are refused at load either way.",
    )
    overlong_buffer: int = Field(
        0,
        ge=0,
        description="DAPO soft overlong penalty: a response longer than max_new_tokens - overlong_buffer tokens "
        "gets a reward penalty growing linearly to overlong_penalty at max_new_tokens; 0 = off.",
    )
    overlong_penalty: float = Field(1.0, ge=0, description="The overlong penalty's size at max_new_tokens.")
    environment: str | None = Field(
        None,
        description="Multi-turn: module:factory of an environment (reset/step, docs/TASKS.md); "
        "the factory is called once per episode. The `guess` task has its own.",
    )
    tools: list[str] = Field(
        default_factory=list,
        description="Multi-turn tool calling: tool names (`calculator`) or module:function; the model calls "
        "them as <tool_call>{...}</tool_call>, its first turn without a call is scored by the task's reward.",
    )
    max_turns: int = Field(4, ge=1, le=64, description="Multi-turn: model turns per episode at most.")
    max_turn_tokens: int | None = Field(
        None, ge=1, description="Multi-turn: tokens per model turn at most (default worker.sampling.max_new_tokens)."
    )
    guess_max: int = Field(9, ge=1, le=99, description="guess: the secret is a number in 0..guess_max.")
    env_threads: int = Field(8, ge=1, le=256, description="Multi-turn: threads running environment / tool steps.")

    @model_validator(mode="after")
    def _one_kind_of_episode(self) -> TaskSection:
        kinds = [
            k
            for k, on in (
                ("task.environment", self.environment),
                ("task.tools", self.tools),
                ("the guess task", self.name == "guess"),
            )
            if on
        ]
        if len(kinds) > 1:
            raise ValueError(f"{' and '.join(kinds)} exclude each other (one kind of episode per run)")
        return self

    @model_validator(mode="after")
    def _tools_need_template(self) -> TaskSection:
        if self.tools and not self.chat_template:
            raise ValueError("task.tools needs chat_template: true (the template shows the model the tools' schemas)")
        return self

    @property
    def multi_turn(self) -> bool:
        """Episodes of several turns (an environment or tools) instead of one response per sample."""
        return bool(self.environment or self.tools or self.name == "guess")

    @model_validator(mode="after")
    def _rewards(self) -> TaskSection:
        if self.reward and self.rewards:
            raise ValueError("set task.reward or task.rewards, not both (task.rewards: [{fn: module:function}])")
        names = [r.default_name() for r in self.rewards]
        if "env" in names:
            raise ValueError("task.rewards: the name 'env' is the multi-turn environment's own reward: pick another")
        doubles = sorted({n for n in names if names.count(n) > 1})
        if doubles:
            raise ValueError(f"task.rewards: two rewards named {doubles[0]!r}: give each a distinct name")
        return self

    @model_validator(mode="after")
    def _system_needs_template(self) -> TaskSection:
        if self.system_prompt is not None and not self.chat_template:
            raise ValueError("system_prompt needs chat_template: true (the system message goes into the template)")
        return self


class SimSection(Section):
    """Simulated engine and learner (control-plane tests and benchmarks)."""

    gen_s_per_token: float = Field(0.001, ge=0, description="Generation cost per token.")
    tokens_per_sample: int = Field(8, ge=1)
    train_s_per_sample: float = Field(0.001, ge=0, description="Training cost per sample.")
    arms: int = Field(8, ge=2, description="Size of the simulated policy's action space.")
    lr: float = Field(0.5, gt=0)
    param_count: int = Field(1024, ge=0, description="Extra parameters, to make weight transfer real.")


class EvalSection(Section):
    """Evaluation during training (docs/OBSERVE.md): k samples per eval prompt with the epoch's weights,
    generated by the workers after the epoch's own groups are handed out, never trained."""

    every_epochs: int = Field(
        0, ge=0, description="Evaluate v_e for every e divisible by N, and the final weights (0 = off)."
    )
    samples: int = Field(4, ge=1, le=256, description="k: samples per eval prompt (pass@k, mean@k).")
    prompts_file: str | None = Field(
        None, description="JSONL of eval prompts (task.prompt_field / task.answer_field); default: the task's own."
    )
    num_prompts: int = Field(32, ge=1, description="Eval prompts drawn from the task when no prompts_file is given.")
    sampling: SamplingSection | None = Field(
        None, description="Eval sampling settings (temperature 0 = greedy is allowed); default: worker.sampling."
    )


class Config(Section):
    run: RunSection = RunSection()
    transport: TransportSection = TransportSection()
    coordinator: CoordinatorSection = CoordinatorSection()
    worker: WorkerSection = WorkerSection()
    buffer: BufferSection = BufferSection()
    trainer: TrainerSection = TrainerSection()
    publisher: PublisherSection = PublisherSection()
    model: ModelSection = ModelSection()
    task: TaskSection = TaskSection()
    sim: SimSection = SimSection()
    eval: EvalSection = EvalSection()
    env: EnvSection | None = Field(
        None, description="Classic RL through env actors (docs/ENVS.md); present = `up` runs the env run."
    )

    @model_validator(mode="after")
    def _bounded_mode(self) -> Config:
        if self.run.staleness_bound() > 0 and "is_correction" not in self.trainer.model_fields_set:
            self.trainer.is_correction = "tis"  # stale samples need a correction: truncated IS, as peers default
        if self.run.mode == "bounded" and (unsupported := bounded_refused(self)):
            raise ValueError(f"run.mode bounded {unsupported}")
        if self.run.max_staleness and self.run.mode != "bounded":
            raise ValueError(f"run.max_staleness ({self.run.max_staleness}) applies to run.mode bounded only")
        return self

    @model_validator(mode="after")
    def _sync_kl_bounded(self) -> Config:
        """worker.sync_kl_threshold decides when a worker may skip versions: only bounded mode with
        k >= 1 lets it hold older weights (periodic, sync and k = 0 load every version, periodic == sync)."""
        if self.worker.sync_kl_threshold is not None and self.run.staleness_bound() == 0:
            where = "run.max_staleness 0" if self.run.mode == "bounded" else f"run.mode {self.run.mode}"
            raise ValueError(
                f"worker.sync_kl_threshold applies to run.mode bounded with run.max_staleness >= 1 only "
                f"(with {where} every worker loads each version at once): leave it out"
            )
        return self

    @model_validator(mode="after")
    def _verify_single_turn(self) -> Config:
        if self.buffer.verify_rewards and self.task.multi_turn:
            raise ValueError(
                "buffer.verify_rewards re-scores a response with the task's reward; a multi-turn episode's "
                "rewards come from its environment, which the buffer cannot replay: turn one of them off"
            )
        return self

    @model_validator(mode="after")
    def _engine_matches_learner(self) -> Config:
        if (self.worker.engine == "sim") != (self.trainer.learner == "sim"):
            raise ValueError("worker.engine 'sim' and trainer.learner 'sim' go together")
        return self

    @model_validator(mode="after")
    def _multi_turn_engine(self) -> Config:
        if self.task.multi_turn and self.worker.engine == "sim":
            raise ValueError("multi-turn tasks (task.environment, task.tools, guess) need worker.engine torch or vllm")
        return self

    @model_validator(mode="after")
    def _trainable_sampling(self) -> Config:
        if self.trainer.learner == "grpo" and self.worker.sampling.temperature == 0:
            raise ValueError(GREEDY_REFUSED)
        return self

    @model_validator(mode="after")
    def _eval_fits_the_engine(self) -> Config:
        rows = max(self.worker.max_batch_rows, self.worker.group_size)
        if self.eval.every_epochs and self.worker.engine == "sim" and self.eval.samples > rows:
            raise ValueError(f"eval.samples ({self.eval.samples}) exceeds the sim engine's batch of {rows} rows")
        multi_turn = bool(self.task.environment or self.task.tools or self.task.name == "guess")
        if self.eval.every_epochs and self.eval.sampling is not None and (self.worker.engine != "torch" or multi_turn):
            raise ValueError(
                "eval.sampling needs worker.engine torch and single-turn episodes (other engines sample with "
                "worker.sampling); leave eval.sampling out to evaluate with worker.sampling"
            )
        return self

    @model_validator(mode="after")
    def _minibatches_fit(self) -> Config:
        steps = self.trainer.num_minibatches * self.trainer.num_iterations
        if steps > 1 and self.trainer.learner != "grpo":
            raise ValueError("trainer.num_minibatches / num_iterations > 1 need trainer.learner grpo")
        if self.trainer.num_minibatches > self.coordinator.groups_per_epoch:
            raise ValueError(
                f"trainer.num_minibatches ({self.trainer.num_minibatches}) exceeds coordinator.groups_per_epoch "
                f"({self.coordinator.groups_per_epoch}): a minibatch needs at least one group"
            )
        return self

    @model_validator(mode="after")
    def _overlong_within_length(self) -> Config:
        if self.task.overlong_buffer > self.worker.sampling.max_new_tokens:
            raise ValueError(
                f"task.overlong_buffer ({self.task.overlong_buffer}) exceeds worker.sampling.max_new_tokens "
                f"({self.worker.sampling.max_new_tokens})"
            )
        return self

    @model_validator(mode="after")
    def _lora_needs_grpo(self) -> Config:
        if self.trainer.lora is not None and self.trainer.learner != "grpo":
            raise ValueError("trainer.lora needs trainer.learner 'grpo' (the sim learner has no model to adapt)")
        return self

    @model_validator(mode="after")
    def _distributed_trainer(self) -> Config:
        if self.trainer.strategy != "single" and self.trainer.learner != "grpo":
            raise ValueError(f"trainer.strategy {self.trainer.strategy} needs trainer.learner grpo")
        if self.trainer.lora is not None and self.trainer.strategy != "single":
            raise ValueError("trainer.lora with trainer.strategy ddp/fsdp2 is not supported yet (untested): use single")
        if self.worker.tensor_parallel_size > 1 and self.worker.engine != "vllm":
            raise ValueError("worker.tensor_parallel_size > 1 needs worker.engine vllm")
        return self

    @model_validator(mode="after")
    def _vllm_dtype(self) -> Config:
        if self.worker.engine == "vllm" and self.model.dtype not in VLLM_DTYPES:
            raise ValueError(
                f"worker.engine 'vllm' runs model.dtype {' or '.join(VLLM_DTYPES)}, not {self.model.dtype}"
            )
        return self

    @model_validator(mode="after")
    def _limits_and_auth(self) -> Config:
        if self.run.workers > self.run.max_workers:
            raise ValueError(f"run.workers ({self.run.workers}) exceeds run.max_workers ({self.run.max_workers})")
        binds = [self.bind_address(r) for r in self.bound_roles()]
        exposed = [f"{r} binds {a}" for r, a in zip(self.bound_roles(), binds, strict=True) if not is_local(a)]
        if self.transport.auth == "none" and exposed:
            raise ValueError(
                "transport.auth 'none' is allowed only when every bound address is loopback or ipc "
                f"({'; '.join(exposed)}); use the default 'curve' (docs/SECURITY.md)"
            )
        return self

    # --- trust and limits (docs/SECURITY.md) -------------------------------------------------

    def authenticated(self) -> bool:
        """CURVE on every socket (not for inproc: one process, no handshake)."""
        return self.transport.auth == "curve" and self.transport.kind != "inproc"

    def bound_roles(self) -> tuple[str, ...]:
        """The roles that bind a socket in this run: the learner only in a classic-RL (env) run."""
        return BINDS if self.env is not None else tuple(r for r in BINDS if r != "learner")

    def keys_path(self) -> Path:
        return Path(self.transport.keys_dir) if self.transport.keys_dir else Path(self.run.run_dir) / "keys"

    def message_limits(self) -> tuple[int, int]:
        """(control, bulk) frame bounds in bytes: control messages, and the weight-chunk sockets."""
        sample = self.worker.sampling.max_new_tokens * 64 + 256  # token id + logprob + text per token
        control = self.transport.max_message_bytes or (1 << 20) + self.worker.group_size * sample
        return control, max(control, self.publisher.chunk_bytes + (64 << 10))

    def address(self, role: str) -> str:
        """The address `role` binds (and others connect to)."""
        if role in self.transport.addresses:
            return self.transport.addresses[role]
        index = _port_offset(role)
        kind = self.transport.kind
        if kind == "tcp":
            base = DEFAULT_BASE_PORT if self.transport.base_port is None else self.transport.base_port
            return f"tcp://{self.transport.host}:{base + index}"
        if kind == "ipc":
            return f"ipc://{Path(self.run.run_dir).resolve() / 'sockets' / role}"
        return f"inproc://prl-{self.run.name}-{role}"

    def bind_address(self, role: str) -> str:
        """The address `role` binds: its connect address, with the host replaced by * if bind_all."""
        addr = self.address(role)
        if self.transport.bind_all and addr.startswith("tcp://"):
            return "tcp://*:" + addr.rsplit(":", 1)[1]
        return addr

    def dump(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _port_offset(role: str) -> int:
    """`role`'s tcp port offset; a ValueError names the roles that have an address."""
    offset = Role(role).port_offset if role in ROLES else None
    if offset is None:
        raise ValueError(f"{role!r} has no address of its own (roles with one: {', '.join(ROLES)})")
    return offset


def is_local(address: str) -> bool:
    """Can only this host reach `address`? inproc, ipc, or tcp on a loopback address."""
    if not address.startswith("tcp://"):
        return address.startswith(("inproc://", "ipc://"))
    host = address.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def safe_on_resume(field: str) -> bool:
    return any(field == safe or (safe.endswith(".") and field.startswith(safe)) for safe in SAFE_ON_RESUME)


def leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'run.epochs': 5, ...}: every field of a dumped config by its dotted name (a dict field, such
    as transport.addresses, is one value)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and f"{prefix}{key}" != "transport.addresses":
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_resume(run: Config, asked: Config) -> None:
    """Refuse (ConfigError, one line naming the fields) a resumed config that would train another
    run than `run`, the one in RUN_DIR/config.yaml; SAFE_ON_RESUME lists what may change."""
    old, new = leaves(run.model_dump(mode="json")), leaves(asked.model_dump(mode="json"))
    keys = list(old) + [k for k in new if k not in old]  # a section set or unset (trainer.lora) changes keys
    changed = [k for k in keys if old.get(k) != new.get(k) and not safe_on_resume(k)]
    if changed:
        what = ", ".join(f"{k} ({old.get(k)!r} -> {new.get(k)!r})" for k in changed)
        raise ConfigError(
            f"--resume continues the run in RUN_DIR/config.yaml and cannot change {what}; "
            "safe to change: epochs, workers, ports and timeouts, threads, devices (README: Resume)"
        )


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """data[a][b][c] = value for 'a.b.c', making the sections on the way."""
    node = data
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted}: {key} is not a section")
    node[leaf] = value


def parse_override(item: str) -> tuple[str, Any]:
    """'trainer.lr=3e-4' -> ('trainer.lr', 3e-4): the value is read as YAML, except for a string
    field (`task.system_prompt=... End with #### ...`), whose value is kept exactly as written (YAML
    would cut it at ' #' or refuse 'Answer: give a number')."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if is_text_field(key):
        return key, None if raw.strip() in ("null", "~") and accepts_none(key) else raw
    try:
        if is_list_field(key) and not raw.strip().startswith(("[", "-")) and raw.strip() not in ("null", "~"):
            return key, [yaml.safe_load(part) for part in raw.split(",") if part.strip()]  # a,b = [a, b]
        return key, yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "config"
        hint = nearest_field(where) if err["type"] == "extra_forbidden" else ""
        lines.append(f"{where}: {err['msg']}" + (f" (did you mean {hint}?)" if hint else ""))
    return "; ".join(lines)


# --- field types, for --set values and typo hints ------------------------------------------------


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """(T, True) for `T | None`; (annotation, False) otherwise."""
    args = get_args(annotation)
    if type(None) in args and len(args) == 2 and get_origin(annotation) in (Union, types.UnionType):
        return next(a for a in args if a is not type(None)), True
    return annotation, False


def _field(dotted: str) -> Any:
    """The pydantic FieldInfo of a dotted config field, or None (no such field)."""
    model: Any = Config
    info = None
    for part in dotted.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        info = model.model_fields[part]
        model = _unwrap_optional(info.annotation)[0]
    return info


def is_text_field(dotted: str) -> bool:
    """Is the field a string (str, str | None, or a Literal of strings)?"""
    info = _field(dotted)
    if info is None:
        return False
    annotation = _unwrap_optional(info.annotation)[0]
    if get_origin(annotation) is Literal:
        return all(isinstance(a, str) for a in get_args(annotation))
    return annotation is str


def is_list_field(dotted: str) -> bool:
    """Is the field a list (`--set run.report_to=tensorboard,wandb` gives one value per comma)?"""
    info = _field(dotted)
    return info is not None and get_origin(_unwrap_optional(info.annotation)[0]) is list


def accepts_none(dotted: str) -> bool:
    info = _field(dotted)
    return info is not None and _unwrap_optional(info.annotation)[1]


# What users of other frameworks call a field (TRL, verl, OpenRLHF): the suggestion by meaning, where
# spelling alone would point elsewhere (`trainer.learning_rate` is closest in spelling to `learner`).
SYNONYMS = {
    "learning_rate": "lr",
    "num_generations": "group_size",
    "n_samples": "group_size",
    "num_samples": "group_size",
    "kl_coef": "beta",
    "kl_beta": "beta",
    "epsilon": "eps_low",
    "clip_range": "eps_low",
    "epsilon_high": "eps_high",
    "clip_grad_norm": "max_grad_norm",
    "grad_clip": "max_grad_norm",
    "max_completion_length": "max_new_tokens",
    "max_tokens": "max_new_tokens",
    "max_response_length": "max_new_tokens",
    "num_epochs": "epochs",
    "num_train_epochs": "epochs",
    "max_steps": "epochs",
    "batch_size": "groups_per_epoch",
    "num_prompts": "groups_per_epoch",
    "model_name_or_path": "path",
    "model_name": "path",
    "dataset": "prompts_file",
    "dataset_path": "prompts_file",
    "output_dir": "run_dir",
    "reward_funcs": "rewards",
    "reward_fn": "reward",
    "num_workers": "workers",
    "logging": "report_to",
}


def nearest_field(dotted: str) -> str:
    """The existing field an unknown dotted name most likely means ('' when none is close): by
    meaning first (SYNONYMS, in this section or another), then by spelling."""
    by_meaning = _synonym(dotted)
    if by_meaning:
        return by_meaning
    *parents, leaf = dotted.split(".")
    model: Any = Config
    if parents:
        info = _field(".".join(parents))
        model = None if info is None else _unwrap_optional(info.annotation)[0]
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return ""
    close = difflib.get_close_matches(leaf, list(model.model_fields), n=1, cutoff=0.6)
    return ".".join([*parents, close[0]]) if close else ""


def _synonym(dotted: str) -> str:
    """The field SYNONYMS names for the last part of `dotted`, in its section if it is there, else in
    the one section that has it ('' when none)."""
    *parents, leaf = dotted.split(".")
    meant = SYNONYMS.get(leaf)
    if meant is None:
        return ""
    if parents and _field(".".join([*parents, meant])) is not None:
        return ".".join([*parents, meant])
    sections = [name for name in Config.model_fields if _field(f"{name}.{meant}") is not None]
    if len(sections) != 1:
        sections = [name for name in ("worker.sampling",) if _field(f"{name}.{meant}") is not None] or sections
    return f"{sections[0]}.{meant}" if sections else ""


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML config file's mapping of sections ({} when empty); ConfigError when it is missing or
    holds no mapping."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        loaded = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {exc}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections")
    return loaded or {}


def validate_config(data: dict[str, Any]) -> Config:
    """A mapping of sections as a Config; ConfigError with one line per problem (as the CLI says it)."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {format_validation_error(exc)}") from None


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Read a YAML config (or the defaults), apply dotted overrides, validate."""
    data = read_config_file(path) if path is not None else {}
    for key, value in (overrides or {}).items():
        set_path(data, key, value)
    return validate_config(data)
