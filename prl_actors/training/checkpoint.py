"""Learner checkpoints: DIR/model (an ordinary HF model directory: weights + tokenizer files),
DIR/optimizer.pt (the optimizer's state) and DIR/trainer_state.pt (version and extra state).
trainer_state.pt is written last, so a directory without it is an incomplete checkpoint and `load`
refuses it. The optimizer's state, twice the weights under Adam, is a file of its own so that only the
newest checkpoint keeps it (rundir.RunDir drops it from older ones): a resume from an older one (the
newest damaged) starts the optimizer afresh, with a warning. A checkpoint written before the split
holds the optimizer in trainer_state.pt; `load` reads both. The weights are the learner's master
weights in their own dtype (float32 also when model.dtype is bfloat16), so a resume is exact.

With LoRA (a peft policy) DIR/adapter replaces DIR/model: the adapter alone, in its float32 master
dtype, the base being the run's model directory; with `merged`, DIR/merged is the base with the
adapter merged in, a plain HF model directory (training/lora.py)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from prl_actors.model.builtin import from_pretrained, quiet_progress
from prl_actors.records.rundir import OPTIMIZER_STATE
from prl_actors.training import lora

STATE_FILE = "trainer_state.pt"
OPTIMIZER_FILE = OPTIMIZER_STATE  # only the newest checkpoint keeps it (records/rundir.py)
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
    torch.save(optimizer.state_dict(), path / OPTIMIZER_FILE)
    torch.save({"version": version, "extra": extra or {}}, path / STATE_FILE)


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
    optim = state.get("optimizer")  # a checkpoint from before optimizer.pt
    if optim is None and (path / OPTIMIZER_FILE).is_file():
        optim = torch.load(path / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
    if optim is not None:
        optimizer.load_state_dict(optim)
    else:
        print(
            f"warning: {path} holds no optimizer state (only the newest checkpoint keeps it): the optimizer "
            "starts afresh",
            file=sys.stderr,
            flush=True,
        )
    return int(state["version"])


def extra_state(path: Path) -> dict[str, Any]:
    """The `extra` saved with the checkpoint at `path` ({} for a checkpoint written before it existed)."""
    state = torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)
    extra = state.get("extra", {})
    return extra if isinstance(extra, dict) else {}


def export_final(out: Path, weights: Mapping[str, torch.Tensor], model_dir: Path) -> None:
    """RUN_DIR/final: the final weights as the workers run them (`weights`: the learner's published
    snapshot, in model.dtype; a checkpoint keeps float32 master weights), as a plain Hugging Face
    directory with `model_dir`'s config (its dtype set to theirs) and tokenizer files."""
    import json

    from safetensors.torch import save_file

    out.mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".index.json")):
            shutil.copy2(f, out / f.name)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"), {"format": "pt"})
    floating = next((t.dtype for t in weights.values() if t.is_floating_point()), None)
    config = out / "config.json"
    if floating is not None and config.is_file():
        data = json.loads(config.read_text())
        name = str(floating).removeprefix("torch.")
        data.update({k: name for k in ("torch_dtype", "dtype") if k in data} or {"torch_dtype": name})
        config.write_text(json.dumps(data, indent=2))
