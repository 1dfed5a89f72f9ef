"""Model families (tiny random-init Qwen2 / Llama / GPT-2 / Mistral): tokenizer quirks, and the
shared-prompt packed forward against the unpacked one and against the engine's sampling log-probs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from prl_actors.engines import batching
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.launch import build
from prl_actors.model.builtin import load_model
from prl_actors.model.tiny import FAMILIES, SLIDING_WINDOW
from prl_actors.model.tokenizer import load_tokenizer
from prl_actors.training.packing import ModelBatch, collate_packed, collate_unpacked, response_logprobs
from tests.learning_utils import tiny_config

pytestmark = pytest.mark.fast


def family_config(model_dir: Path, dtype: str = "float32", **overrides: object):  # type: ignore[no-untyped-def]
    return tiny_config(
        model__path=str(model_dir), model__dtype=dtype, task__name="math", task__chat_template=True,
        task__system_prompt="Answer with a number.", worker__sampling__max_new_tokens=12, worker__group_size=3,
        **overrides,
    )  # fmt: skip


def rollouts(model_dir: Path, dtype: str) -> tuple[list[tuple[list[int], list[list[int]]]], list[float]]:
    """Three groups of the math sample (prompts of different lengths: left padding) sampled by the
    torch engine; returns (prompt ids, responses) per group and the engine's log-probs, flat."""
    cfg = family_config(model_dir, dtype)
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    prompts = build.task(cfg).prompts_for_epoch(0, 3)
    groups = engine.generate(prompts, cfg.worker.group_size)
    pairs = [(g.prompt_ids, [s.token_ids for s in g.samples]) for g in groups]
    assert len({len(p) for p, _ in pairs}) > 1, "prompts of one length would not exercise left padding"
    assert max(len(p) for p, _ in pairs) > SLIDING_WINDOW, "sequences must exceed Mistral's window"
    return pairs, [lp for g in groups for s in g.samples for lp in s.logprobs]


def logprobs(model: torch.nn.Module, batch: ModelBatch) -> torch.Tensor:
    with torch.no_grad():
        return response_logprobs(model, batch)


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_equals_unpacked_exactly(family: str, family_dirs: dict[str, Path]) -> None:
    """float64: the shared-prompt row gives the unpacked log-probs up to float64 rounding, for rotary
    (qwen2, llama, mistral: sliding window 8) and absolute (gpt2) positions, tied or not, GQA."""
    pairs, _ = rollouts(family_dirs[family], "float64")
    model = load_model(family_dirs[family], dtype="float64")
    packed, unpacked = logprobs(model, collate_packed(pairs)), logprobs(model, collate_unpacked(pairs))
    assert packed.numel() > 20
    assert (packed - unpacked).abs().max().item() < 1e-10
    wrong = collate_packed(pairs)
    wrong.position_ids = torch.arange(wrong.input_ids.shape[1]).repeat(wrong.input_ids.shape[0], 1)  # not restarted
    assert (logprobs(model, wrong) - unpacked).abs().max().item() > 1e-3  # positions do matter


@pytest.mark.parametrize("store", [True, False], ids=["shared-prefix", "kv-cache"])
@pytest.mark.parametrize("family", FAMILIES)
def test_engine_logprobs_equal_the_trainer_forward(
    family: str, store: bool, family_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32: what the worker reports (left-padded batch, decoding from the shared-prefix store or
    from a KV cache per row) is what the trainer computes. Mistral (sliding window) has no store."""
    monkeypatch.setattr(batching, "SHARE_FROM", 0 if store else 10**9)
    pairs, engine_lp = rollouts(family_dirs[family], "float32")
    model = load_model(family_dirs[family], dtype="float32")
    packed = logprobs(model, collate_packed(pairs))
    assert (packed - torch.tensor(engine_lp)).abs().max().item() < 1e-4


def test_mixed_full_and_sliding_layers() -> None:
    """A model with full and sliding-window layers gets one mask per layer type."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, use_sliding_window=True, sliding_window=4, max_window_layers=1, initializer_range=0.2,
    )  # fmt: skip
    assert config.layer_types == ["full_attention", "sliding_attention"]
    model = Qwen2ForCausalLM(config).double().eval()
    pairs = [([1, 5, 9, 3, 7, 2], [[4, 8, 10, 11, 12, 13], [6, 6]]), ([3, 4, 5], [[9, 9, 9, 9, 9, 9, 9]])]
    unpacked = logprobs(model, collate_unpacked(pairs))
    assert (logprobs(model, collate_packed(pairs)) - unpacked).abs().max().item() < 1e-10
    model.config.sliding_window = None  # what the packed forward was before: the window ignored
    assert (logprobs(model, collate_packed(pairs)) - unpacked).abs().max().item() > 1e-3


@pytest.mark.parametrize(
    ("family", "eos", "pad"),
    [
        ("qwen2", {"<|im_end|>", "<|endoftext|>"}, "<|endoftext|>"),
        ("llama", {"<|end_of_text|>", "<|eot_id|>"}, "<|end_of_text|>"),  # no pad token: eos stands in
        ("gpt2", {"<|endoftext|>"}, "<|endoftext|>"),
        ("mistral", {"</s>"}, "</s>"),
    ],
)
def test_eos_and_pad_quirks(family: str, eos: set[str], pad: str, family_dirs: dict[str, Path]) -> None:
    """The engine stops on the tokenizer's eos and every eos of the generation config (Llama's chat
    turn ends with <|eot_id|>, which only the generation config names)."""
    engine = TorchEngine(build.engine_settings(family_config(family_dirs[family])), family_dirs[family])
    tok = load_tokenizer(family_dirs[family])
    assert engine.eos_ids == {tok.convert_tokens_to_ids(t) for t in eos}
    assert engine.pad_id == tok.convert_tokens_to_ids(pad)


def test_concurrent_loads_keep_tied_weights(family_dirs: dict[str, Path]) -> None:
    """LocalCluster loads the model in several actor threads at once; transformers' load patches
    tie_weights process-wide, so unserialised loads left a tied lm_head on the meta device."""
    import threading

    loaded: list[torch.nn.Module] = []
    threads = [threading.Thread(target=lambda: loaded.append(load_model(family_dirs["gpt2"]))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loaded) == 3
    for model in loaded:
        head, embed = model.get_output_embeddings().weight, model.get_input_embeddings().weight
        assert head is embed and head.device.type == "cpu"
