"""Tiny random-init checkpoints of real model families, built locally (never downloaded): each with
its own byte-level BPE tokenizer (trained here on a tiny corpus) and chat template, written as an
ordinary local HF directory that `model.path` takes. Tests use them; users can try a config with
one before pointing it at a real checkpoint:

    python -m prl_actors.model.tiny qwen2 runs/tiny-qwen2

The families differ where real checkpoints differ:
* qwen2:   rotary, GQA (4 heads / 2 kv), tied embeddings, attention biases, no BOS, ChatML template,
           eos <|im_end|> plus <|endoftext|> in the generation config, pad <|endoftext|>.
* llama:   rotary, GQA, untied, the tokenizer adds <|begin_of_text|> (and so does the template),
           eos <|end_of_text|> but the chat turn ends with <|eot_id|> (only in the generation config),
           no pad token.
* gpt2:    absolute position embeddings, tied, bos = eos = unk = <|endoftext|>, no pad token.
* mistral: rotary, GQA, sliding-window attention (window 8, shorter than the sequences), <s> added by
           the tokenizer and the template, [INST] template that folds the system prompt into the turn,
           no pad token.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from prl_actors.data.builtin import sample_file
from prl_actors.model.builtin import quiet_progress

FAMILIES = ("qwen2", "llama", "gpt2", "mistral")
HIDDEN, LAYERS, HEADS, KV_HEADS = 32, 2, 4, 2
SLIDING_WINDOW = 8
INIT_RANGE = 0.2  # peaked, position-sensitive distributions: a wrong position or mask shows in log-probs

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
PLAIN = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% set ns = namespace(system='') %}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.system = m['content'] + '\n\n' %}"
    "{% elif m['role'] == 'user' %}[INST] {{ ns.system }}{{ m['content'] }} [/INST]{% set ns.system = '' %}"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


@dataclass(frozen=True)
class Family:
    specials: tuple[str, ...]
    tokens: dict[str, str]  # bos/eos/unk/pad -> token
    bos_added: str | None  # the token the tokenizer prepends, if any
    template: str
    eos_extra: tuple[str, ...]  # more stop tokens in generation_config
    make: Callable[[int, dict[str, int]], tuple[PretrainedConfig, type[PreTrainedModel]]]


def _qwen2(vocab: int, ids: dict[str, int]) -> tuple[PretrainedConfig, type[PreTrainedModel]]:
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, tie_word_embeddings=True,
        max_position_embeddings=512, initializer_range=INIT_RANGE,
    )  # fmt: skip
    return cfg, Qwen2ForCausalLM


def _llama(vocab: int, ids: dict[str, int]) -> tuple[PretrainedConfig, type[PreTrainedModel]]:
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, tie_word_embeddings=False,
        max_position_embeddings=512, initializer_range=INIT_RANGE,
    )  # fmt: skip
    return cfg, LlamaForCausalLM


def _gpt2(vocab: int, ids: dict[str, int]) -> tuple[PretrainedConfig, type[PreTrainedModel]]:
    cfg = GPT2Config(
        vocab_size=vocab, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=512,
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], initializer_range=INIT_RANGE,
    )  # fmt: skip
    return cfg, GPT2LMHeadModel


def _mistral(vocab: int, ids: dict[str, int]) -> tuple[PretrainedConfig, type[PreTrainedModel]]:
    cfg = MistralConfig(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, tie_word_embeddings=False,
        max_position_embeddings=512, sliding_window=SLIDING_WINDOW, initializer_range=INIT_RANGE,
    )  # fmt: skip
    return cfg, MistralForCausalLM


SPECS = {
    "qwen2": Family(
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        {"eos": "<|im_end|>", "pad": "<|endoftext|>"},
        None,
        CHATML,
        ("<|endoftext|>",),
        _qwen2,
    ),
    "llama": Family(
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        {"bos": "<|begin_of_text|>", "eos": "<|end_of_text|>"},
        "<|begin_of_text|>",
        LLAMA3,
        ("<|eot_id|>",),
        _llama,
    ),
    "gpt2": Family(
        ("<|endoftext|>",),
        {"bos": "<|endoftext|>", "eos": "<|endoftext|>", "unk": "<|endoftext|>"},
        None,
        PLAIN,
        (),
        _gpt2,
    ),
    "mistral": Family(
        ("<unk>", "<s>", "</s>", "[INST]", "[/INST]"),
        {"bos": "<s>", "eos": "</s>", "unk": "<unk>"},
        "<s>",
        MISTRAL,
        (),
        _mistral,
    ),
}


def corpus() -> list[str]:
    """The shipped math problems plus a few chat turns: enough text for a few hundred merges."""

    rows = [
        json.loads(line) for line in Path(sample_file("math_sample.jsonl")).read_text().splitlines() if line.strip()
    ]
    texts = [r["question"] + "\n" + r["answer"] for r in rows]
    return texts + ["system: Answer with the number after ####.", "assistant: #### 42", "The answer is \\boxed{7}."]


def build_tokenizer(spec: Family, vocab_size: int = 384) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(spec.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    if spec.bos_added is not None:
        bos_id = tok.token_to_id(spec.bos_added)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos_added} $A", pair=f"{spec.bos_added} $A $B", special_tokens=[(spec.bos_added, bos_id)]
        )
    names = {f"{k}_token": v for k, v in spec.tokens.items()}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **names)
    fast.add_special_tokens({"additional_special_tokens": [s for s in spec.specials if s not in spec.tokens.values()]})
    fast.chat_template = spec.template
    return fast


def token_id(tok: PreTrainedTokenizerFast, token: str) -> int:
    found = tok.convert_tokens_to_ids(token)
    assert isinstance(found, int), token
    return found


def build_family(name: str, out_dir: Path, seed: int = 0) -> Path:
    """Write the tiny `name` checkpoint (weights, config, tokenizer, template) into `out_dir`."""
    spec = SPECS[name]
    tok = build_tokenizer(spec)
    ids = {k: token_id(tok, v) for k, v in spec.tokens.items()}
    config, cls = spec.make(len(tok), ids)
    config.bos_token_id = ids.get("bos")
    config.eos_token_id = ids["eos"]
    config.pad_token_id = ids.get("pad")
    torch.manual_seed(seed)
    model = cls(config)
    eos = [ids["eos"], *(token_id(tok, t) for t in spec.eos_extra)]
    model.generation_config.eos_token_id = eos if len(eos) > 1 else eos[0]
    model.generation_config.pad_token_id = ids.get("pad")
    model.generation_config.bos_token_id = ids.get("bos")
    out_dir.mkdir(parents=True, exist_ok=True)
    with quiet_progress():
        model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def build_all(root: Path) -> dict[str, Path]:
    return {name: build_family(name, root / name) for name in FAMILIES}


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Write a tiny random-init checkpoint of a model family.")
    parser.add_argument("family", choices=FAMILIES)
    parser.add_argument("out", type=Path, help="the directory to write (model.path)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_family(args.family, args.out, args.seed))


if __name__ == "__main__":
    main()
