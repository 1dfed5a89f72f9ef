"""The memory note's numbers: the parameter-count formula against the real HF modules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from prl_actors.model.memory import QWEN25, Arch, lora_param_count, param_count, render

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent


def hf_config(a: Arch, cls: type) -> object:
    return cls(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, tie_word_embeddings=a.tied,
    )  # fmt: skip


def numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied weight is counted once


@pytest.mark.parametrize("size", list(QWEN25))
def test_param_count_of_the_real_qwen25_shapes(size: str) -> None:
    """The full-size architectures, instantiated on the meta device (no memory, no download)."""
    a = QWEN25[size]
    with torch.device("meta"):
        model = Qwen2ForCausalLM(hf_config(a, Qwen2Config))
    assert param_count(a) == numel(model)


TINY = [
    (Arch("qwen2-tied", 300, 32, 64, 2, 4, 2, tied=True, qkv_bias=True), Qwen2Config, Qwen2ForCausalLM),
    (Arch("qwen2-untied", 300, 32, 48, 3, 4, 1, tied=False, qkv_bias=True), Qwen2Config, Qwen2ForCausalLM),
    (Arch("llama", 257, 48, 80, 2, 6, 2, tied=False, qkv_bias=False), LlamaConfig, LlamaForCausalLM),
    (Arch("mistral", 200, 32, 64, 2, 4, 4, tied=False, qkv_bias=False), MistralConfig, MistralForCausalLM),
]


@pytest.mark.parametrize(("arch", "config_cls", "model_cls"), TINY, ids=[t[0].name for t in TINY])
def test_param_count_of_tiny_models(arch: Arch, config_cls: type, model_cls: type) -> None:
    """Really instantiated, in every variant the formula distinguishes (tied, biases, GQA)."""
    assert param_count(arch) == numel(model_cls(hf_config(arch, config_cls)))


def test_lora_count_from_the_model_modules() -> None:
    """r * (in + out) for every targeted nn.Linear of the real module tree."""
    a, r = QWEN25["1.5B"], 16
    with torch.device("meta"):
        model = Qwen2ForCausalLM(hf_config(a, Qwen2Config))
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    expected = sum(
        r * (m.in_features + m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets
    )
    assert lora_param_count(a, r) == expected
    assert lora_param_count(a, r, ("q_proj", "v_proj")) < expected


def test_memory_doc_shows_the_computed_tables() -> None:
    doc = (ROOT / "docs/MEMORY.md").read_text()
    for table in re.split(r"\n\n(?=###)", render()):
        assert table in doc, f"docs/MEMORY.md is stale: regenerate with python -m prl_actors.model.memory\n{table[:80]}"
