"""Helpers for the vLLM tier: a vLLM-sized checkpoint and an independent torch reference of the
behaviour log-probs (softmax(logits / T) on the top-p nucleus, renormalised)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from prl_actors.config import Config, load_config
from prl_actors.engines.base import GeneratedGroup
from prl_actors.model.builtin import create_builtin

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(
    not HAVE_VLLM, reason="vLLM is not installed in this venv: `make test-vllm` builds .venv-vllm with it"
)


def vllm_config(run_dir: Path, **overrides: object) -> Config:
    """A vLLM-engine config on a built-in model whose head size (128 / 2 = 64) vLLM's CPU attention
    supports (the default 64 / 4 = 16 is refused); small memory share, eager mode."""
    base: dict[str, object] = {
        "run.run_dir": str(run_dir),
        "model.hidden_size": 128,
        "model.heads": 2,
        "model.layers": 2,
        "model.warm_start_steps": 0,
        "worker.engine": "vllm",
        "worker.group_size": 4,
        "worker.gpu_memory_utilization": 0.1,
        "worker.enforce_eager": True,
        "worker.sampling.max_new_tokens": 6,
    }
    base.update({k.replace("__", "."): v for k, v in overrides.items()})
    return load_config(None, base)


def make_checkpoint(cfg: Config, out_dir: Path, sharpen: float = 1.0) -> Path:
    """A local HF Qwen2 checkpoint (config.json, model.safetensors, tokenizer) built from `cfg.model`,
    its output layer scaled by `sharpen`: a random model's next-token distribution is nearly uniform,
    a sharper one makes every weight change visible in the log-probs (and costs no warm start)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    create_builtin(cfg.model, cfg.task, cfg.run.seed, out_dir)
    if sharpen != 1.0:
        path = str(out_dir / "model.safetensors")
        state = load_file(path)
        state["lm_head.weight"] = state["lm_head.weight"] * sharpen
        save_file(state, path, metadata={"format": "pt"})
    return out_dir


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """[N, V] bool: the smallest set of most likely tokens with mass >= top_p (top token always in)."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep = (sorted_p.cumsum(-1) - sorted_p) < top_p
    keep[:, 0] = True
    return torch.zeros_like(keep).scatter(-1, order, keep)


@torch.no_grad()
def reference_logprobs(
    model: torch.nn.Module, prompt_ids: list[int], tokens: list[int], temperature: float, top_p: float
) -> torch.Tensor:
    """log q(token) for each response token under `model`, [len(tokens)], float64 reference."""
    ids = torch.tensor([prompt_ids + tokens])  # [1, P + R]
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].double() / temperature  # [R, V]
    if top_p < 1.0:
        logits = logits.masked_fill(~nucleus(torch.softmax(logits, -1), top_p), float("-inf"))
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def max_logprob_diff(
    model: torch.nn.Module, groups: list[GeneratedGroup], temperature: float, top_p: float
) -> tuple[float, int]:
    """(max |engine - reference| over every sampled token, number of tokens compared)."""
    worst, count = 0.0, 0
    for g in groups:
        for s in g.samples:
            ref = reference_logprobs(model, g.prompt_ids, s.token_ids, temperature, top_p)
            got = torch.tensor(s.logprobs, dtype=torch.float64)
            worst = max(worst, (ref - got).abs().max().item())
            count += len(s.token_ids)
    return worst, count


def digit_share(prompt: str, response: str, answer: str) -> float:
    """A partial-credit reward a random model already earns unevenly (the share of digits in the
    response), so every group has a learning signal without a warm start."""
    return sum(c.isdigit() for c in response) / len(response) if response else 0.0
