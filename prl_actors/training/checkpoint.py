"""Learner checkpoints: DIR/model (an ordinary HF model directory: weights + tokenizer files) and
DIR/trainer_state.pt (optimizer state and version). trainer_state.pt is written last, so a directory
without it is an incomplete checkpoint and `load` refuses it. The weights are the learner's master
weights in their own dtype (float32 also when model.dtype is bfloat16), so a resume is exact."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import PreTrainedModel

from prl_actors.model.builtin import from_pretrained, quiet_progress

STATE_FILE = "trainer_state.pt"
MODEL_DIR = "model"
_COPY = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
    "chat_template.jinja",
)


def save(path: Path, policy: PreTrainedModel, optimizer: torch.optim.Optimizer, version: int, source_dir: Path) -> None:
    """Write the checkpoint of `policy` (tokenizer files copied from the initial `source_dir`)."""
    path = Path(path)
    (path / STATE_FILE).unlink(missing_ok=True)
    with quiet_progress():
        policy.save_pretrained(path / MODEL_DIR)
    for name in _COPY:
        if (source_dir / name).is_file():
            shutil.copy2(source_dir / name, path / MODEL_DIR / name)
    torch.save({"version": version, "optimizer": optimizer.state_dict()}, path / STATE_FILE)


def load(path: Path, policy: PreTrainedModel, optimizer: torch.optim.Optimizer) -> int:
    """Restore weights and optimizer state in place; returns the checkpoint's version."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    saved = from_pretrained(path / MODEL_DIR, dtype=policy.dtype)  # serialised: concurrent HF loads break tied weights
    policy.load_state_dict(saved.state_dict(), strict=True)
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    return int(state["version"])
