"""The `worker:` section: the inference workers (engine, batch, group size; `sampling:` lives in engines/config.py).

A section lives beside the code that reads it; prl_actors/config.py composes every section into the
run's `Config` and holds the rules that span sections (docs/CONFIG.md lists every field)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from prl_actors.engines.config import SamplingSection
from prl_actors.sections import Section, Threads


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
