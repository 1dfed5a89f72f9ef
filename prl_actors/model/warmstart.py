"""Supervised warm start of the built-in model on the `add` task.

A few AdamW steps of teacher forcing on "<bos>a+b=" -> "sum<eos>" (loss on the answer tokens only).
The point is a *partially* right model: it has learned the format and some sums, so sampling at
temperature 1 is right some of the time and GRPO has room (and signal) to improve it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from prl_actors.data.builtin import IGNORE, add_items


def encode_example(tok: PreTrainedTokenizerBase, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """(input ids, labels) of one example; labels are IGNORE on the prompt."""
    p = tok(prompt).input_ids
    a = tok(answer, add_special_tokens=False).input_ids + [tok.eos_token_id]
    return p + a, [IGNORE] * len(p) + a


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids/labels/attention_mask, each [B, T]."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id)  # [B, T]
    labels = torch.full((len(examples), width), IGNORE)  # [B, T]
    mask = torch.zeros((len(examples), width), dtype=torch.long)  # [B, T]
    for row, (x, y) in enumerate(examples):
        ids[row, : len(x)] = torch.tensor(x)
        labels[row, : len(y)] = torch.tensor(y)
        mask[row, : len(x)] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def warm_start(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    max_operand: int,
    steps: int,
    seed: int,
    label_smoothing: float = 0.0,
    lr: float = 3e-3,
    batch_size: int = 64,
    on_step: Callable[[int, int], None] | None = None,
) -> list[float]:
    """Train `model` in place for `steps` steps; returns the loss of every step. With label
    smoothing the model stays under-confident (see ModelSection.warm_start_smoothing).
    `on_step(done, steps)` is called after every step (progress display)."""
    items = add_items(max_operand)
    examples = [encode_example(tok, p, a) for p, a in items]
    return warm_start_on(model, tok, examples, steps, seed, label_smoothing, lr, batch_size, on_step)


def warm_start_on(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    examples: list[tuple[list[int], list[int]]],
    steps: int,
    seed: int,
    label_smoothing: float = 0.0,
    lr: float = 3e-3,
    batch_size: int = 64,
    on_step: Callable[[int, int], None] | None = None,
) -> list[float]:
    """`warm_start` on any (input ids, labels) examples (e.g. the guess game's transcripts)."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        batch = collate([examples[rng.randrange(len(examples))] for _ in range(batch_size)], tok.pad_token_id)
        labels = batch.pop("labels")
        logits = model(**batch).logits[:, :-1].float()  # [B, T-1, V]
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE, label_smoothing=label_smoothing
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(len(losses), steps)
    model.eval()
    return losses
