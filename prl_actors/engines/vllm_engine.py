"""The vLLM engine (optional: `pip install prl-actors[vllm]`), behind the same Engine interface.

Written to vLLM's documented offline API:
* generation: `vllm.LLM(model=DIR, ...)`, `SamplingParams(n=G, temperature, top_p, max_tokens,
  logprobs=0, seed)` and `LLM.generate(..., use_tqdm=False)`; `logprobs=0` returns the log-prob of
  each sampled token. The engine is built with `logprobs_mode="raw_logprobs"` (vLLM >= 0.10.2; the
  V1 default) so those are log-probs of the raw model distribution, before temperature / top-p — the
  same convention as the torch engine and what the trainer's forward computes.
* in-place weight update: `LLM.collective_rpc(fn, args=(weights,))` runs `fn(worker, weights)` on
  every worker, and `fn` calls `worker.model_runner.model.load_weights(weights=[(name, tensor), ...])`
  — the pattern of vLLM's RLHF examples (examples/offline_inference/rlhf_utils.py,
  `WorkerExtension.update_weight`). vLLM's model classes map HF parameter names (and fused
  q/k/v, gate/up projections) themselves. After a swap the prefix cache is reset
  (`LLM.reset_prefix_cache()`), or KV blocks computed with the old weights would be reused.

Each group is sampled with `seed = seed_for(run.seed, version, group_id)` (vLLM per-request seed).
vLLM is imported lazily, so this module imports fine without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prl_actors.config import Config, ConfigError
from prl_actors.engines.base import Generated, GeneratedGroup, OneCallStreaming
from prl_actors.engines.sampling import seed_for
from prl_actors.engines.torch_engine import to_torch
from prl_actors.protocol.messages import Prompt

MISSING = "vLLM is not installed; pip install prl-actors[vllm]"


def _load_on_worker(worker: Any, weights: list[tuple[str, Any]]) -> None:
    """Runs inside each vLLM worker (sent by collective_rpc)."""
    worker.model_runner.model.load_weights(weights=weights)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError:
        raise ConfigError(MISSING) from None
    return vllm


class VllmEngine(OneCallStreaming):
    """Engine protocol on vLLM; holds exactly one weight version at a time."""

    def __init__(self, cfg: Config, model_dir: Path | str) -> None:
        self._vllm = _import_vllm()
        kwargs: dict[str, Any] = {"model": str(model_dir), "dtype": cfg.model.dtype, "seed": cfg.run.seed}
        try:
            self.llm = self._vllm.LLM(**kwargs, logprobs_mode="raw_logprobs")
        except TypeError:  # older vLLM without logprobs_mode: its logprobs are raw already
            self.llm = self._vllm.LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.sampling = cfg.worker.sampling
        self.seed = cfg.run.seed
        self.version = -1

    def load_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        weights = [(name, to_torch(t)) for name, t in tensors.items()]
        self.llm.collective_rpc(_load_on_worker, args=(weights,))
        self.llm.reset_prefix_cache()
        self.version = version

    def _params(self, prompt: Prompt, group_size: int) -> Any:
        s = self.sampling
        return self._vllm.SamplingParams(
            n=group_size,
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_new_tokens,
            logprobs=0,
            seed=seed_for(self.seed, self.version, prompt.group_id),
        )

    def generate_now(self, prompts: list[Prompt], group_size: int) -> list[GeneratedGroup]:
        if not prompts:
            return []
        ids = [self.tokenizer(p.prompt).input_ids for p in prompts]
        requests = [{"prompt_token_ids": x} for x in ids]
        params = [self._params(p, group_size) for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [self._group(p, x, out) for p, x, out in zip(prompts, ids, outputs, strict=True)]

    def _group(self, prompt: Prompt, prompt_ids: list[int], out: Any) -> GeneratedGroup:
        group = GeneratedGroup(group_id=prompt.group_id, prompt=prompt.prompt, prompt_ids=list(prompt_ids))
        for c in out.outputs:
            tokens = list(c.token_ids)
            logprobs = [float(step[t].logprob) for step, t in zip(c.logprobs, tokens, strict=True)]
            group.samples.append(Generated(c.text, tokens, logprobs, finished=c.finish_reason == "stop"))
        return group

    def close(self) -> None:
        self.llm = None
