"""Learner checkpoints: DIR/model (an ordinary HF model directory: weights + tokenizer files) and
DIR/trainer_state.pt (optimizer state and version). trainer_state.pt is written last, so a directory
without it is an incomplete checkpoint and `load` refuses it. The weights are the learner's master
weights in their own dtype (float32 also when model.dtype is bfloat16), so a resume is exact.

With LoRA (a peft policy) DIR/adapter replaces DIR/model: the adapter alone, in its float32 master
dtype, the base being the run's model directory; with `merged`, DIR/merged is the base with the
adapter merged in, a plain HF model directory (training/lora.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from prl_actors.model.builtin import from_pretrained, quiet_progress
from prl_actors.training import lora

STATE_FILE = "trainer_state.pt"
MODEL_DIR = "model"


def is_lora(policy: PreTrainedModel) -> bool:
    return hasattr(policy, "peft_config")


def save(
    path: Path,
    policy: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    version: int,
    source_dir: Path,
    merged: bool = False,
    extra: dict[str, object] | None = None,
) -> None:
    """Write the checkpoint of `policy` (tokenizer files copied from the initial `source_dir`);
    `extra` (tensors and plain values: the lr schedule's horizon, a synced reference) goes into
    trainer_state.pt beside the optimizer (`extra_state` reads it back)."""
    path = Path(path)
    (path / STATE_FILE).unlink(missing_ok=True)
    if is_lora(policy):
        lora.save_adapter(path, policy)
        if merged:
            lora.export_merged(path, path / lora.MERGED_DIR, source_dir)
    else:
        _save_model(path, policy, source_dir)
    torch.save({"version": version, "optimizer": optimizer.state_dict(), "extra": extra or {}}, path / STATE_FILE)


def _save_model(path: Path, policy: PreTrainedModel, source_dir: Path) -> None:
    with quiet_progress():
        policy.save_pretrained(path / MODEL_DIR)
    for name in lora.TOKENIZER_FILES:
        if (source_dir / name).is_file():
            shutil.copy2(source_dir / name, path / MODEL_DIR / name)


def load(path: Path, policy: PreTrainedModel, optimizer: torch.optim.Optimizer) -> int:
    """Restore weights (or the LoRA adapter) and optimizer state in place; returns the version."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    if is_lora(policy):
        lora.load_adapter(path, policy)
    else:
        if not (path / MODEL_DIR).is_dir():
            raise FileNotFoundError(f"{path} holds no {MODEL_DIR}/ (a LoRA checkpoint? the run has no trainer.lora)")
        saved = from_pretrained(path / MODEL_DIR, dtype=policy.dtype)  # serialised: concurrent loads break tying
        policy.load_state_dict(saved.state_dict(), strict=True)
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    return int(state["version"])


def extra_state(path: Path) -> dict[str, Any]:
    """The `extra` saved with the checkpoint at `path` ({} for a checkpoint written before it existed)."""
    state = torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)
    extra = state.get("extra", {})
    return extra if isinstance(extra, dict) else {}
