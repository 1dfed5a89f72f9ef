"""The data position, part of every checkpoint: CHECKPOINT/data.json.

The sampler is stateless (data/sampler.py): the prompts of epoch e are a pure function of (seed, e,
B, the items). A checkpoint of version v (= the next epoch to run) therefore pins the data position
once the items are pinned, and data.json records both:

    {"task", "sampler", "seed", "groups_per_epoch", "epoch_stride", "rows", "sha256"}   the stream's identity
    {"epoch", "pass", "offset"}                                          where epoch v starts in it

`epoch_stride` is the stream positions one epoch spans: B, or B x coordinator.max_sampling_rounds
with dynamic sampling (training/dynamic_sampling.py: an epoch's extra rounds take the positions after
its B; those it does not need are skipped). A record without it (older checkpoints) has stride B.

`sha256` hashes every (prompt, answer) after field mapping and chat templating, so a changed file,
field, template or system prompt is noticed. A resumed run whose identity differs is refused: it
would continue from the same (pass, offset) of a *different* stream (prompts skipped or repeated).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prl_actors.data.sampler import SAMPLER
from prl_actors.sections import ConfigError

POSITION_FILE = "data.json"
IDENTITY_KEYS = ("task", "sampler", "seed", "groups_per_epoch", "epoch_stride", "rows", "sha256")


def identity(
    task_name: str, seed: int, groups_per_epoch: int, rows: int, sha256: str, epoch_stride: int = 0
) -> dict[str, Any]:
    return {
        "task": task_name,
        "sampler": SAMPLER,
        "seed": seed,
        "groups_per_epoch": groups_per_epoch,
        "epoch_stride": epoch_stride or groups_per_epoch,
        "rows": rows,
        "sha256": sha256,
    }


def _stored(stored: dict[str, Any], key: str) -> Any:
    if key == "epoch_stride" and key not in stored:
        return stored.get("groups_per_epoch")  # written before dynamic sampling: stride B
    return stored.get(key)


def record(ident: dict[str, Any], epoch: int) -> dict[str, Any]:
    """The identity plus the position of `epoch`'s first prompt: (pass, offset) in the stream."""
    pass_index, offset = divmod(epoch * ident["epoch_stride"], ident["rows"])
    return {**ident, "epoch": epoch, "pass": pass_index, "offset": offset}


def save(checkpoint_dir: Path, ident: dict[str, Any], epoch: int) -> None:
    (Path(checkpoint_dir) / POSITION_FILE).write_text(json.dumps(record(ident, epoch), indent=1) + "\n")


def load(checkpoint_dir: Path) -> dict[str, Any] | None:
    """The checkpoint's record, or None when it has none (written before data positions existed)."""
    path = Path(checkpoint_dir) / POSITION_FILE
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text())
    except ValueError:
        raise ConfigError(f"{path} is not valid JSON: the checkpoint's data position is unreadable") from None
    return stored if isinstance(stored, dict) else None


def verify(checkpoint_dir: Path, ident: dict[str, Any]) -> dict[str, Any] | None:
    """Refuse to resume from `checkpoint_dir` when its data identity differs from `ident`; returns
    the stored record (None if the checkpoint has none)."""
    stored = load(checkpoint_dir)
    if stored is None:
        return None
    changed = [k for k in IDENTITY_KEYS if _stored(stored, k) != ident[k]]
    if changed:
        diffs = ", ".join(f"{k}: {_stored(stored, k)!r} -> {ident[k]!r}" for k in changed)
        raise ConfigError(
            f"run.resume: the prompt data differ from those of checkpoint {checkpoint_dir} ({diffs}); resuming "
            "would skip or repeat prompts. Restore the data and settings, or start a new run_dir"
        )
    return stored
