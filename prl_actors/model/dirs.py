"""Model directories without torch: the built-in model's cache key, the user's cache, and the fast
path of `prepare_model` (a directory that needs no build). `prl-actors up` uses it so that a run whose
model is already built starts without importing torch or transformers in the `up` process (seconds
of a start-up on a busy host); model/builtin.py builds the model when one must be built.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from prl_actors.sections import ConfigError

if TYPE_CHECKING:
    from prl_actors.model.config import ModelSection
    from prl_actors.tasks.config import TaskSection

BUILDER_VERSION = 1  # bump when the built-in recipe (model/builtin.py) changes: cached models are then rebuilt
STAMP = "prl_builtin.json"


def builtin_key(model: ModelSection, task: TaskSection, seed: int) -> str:
    """Hash of everything that determines the built-in model's weights: the model section, the task
    it is warm-started on and `seed` (run.seed)."""
    spec = {
        "builder": BUILDER_VERSION,
        "model": model.model_dump(exclude={"path", "dtype"}),
        "max_operand": task.max_operand,
        "seed": seed,
    }
    if task.name == "guess":  # warm-started on the game instead (other keys unchanged: caches stay valid)
        spec["guess"] = {"max": task.guess_max, "turns": task.max_turns}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def validate_model_dir(path: str) -> Path:
    """A user model must be a local directory with config.json (we never download)."""
    p = Path(path).expanduser()
    if not (p.is_dir() and (p / "config.json").is_file()):
        raise ConfigError(
            f"model.path {path!r} is not a local model directory with config.json "
            "(prl-actors never downloads models; save one with save_pretrained first)"
        )
    return p.resolve()


def is_current(model_dir: Path, key: str) -> bool:
    try:
        return json.loads((model_dir / STAMP).read_text()).get("key") == key
    except (OSError, ValueError):
        return False


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock, so actors of one run sharing a run_dir build the model once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cache_dir() -> Path | None:
    """Where built-in models are kept between runs: $PRL_CACHE_DIR, else $XDG_CACHE_HOME/prl-actors,
    else ~/.cache/prl-actors; None (build in every run dir) when it cannot be written or
    PRL_CACHE_DIR is empty."""
    env = os.environ.get("PRL_CACHE_DIR")
    if env == "":
        return None
    root = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prl-actors"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return root if os.access(root, os.W_OK) else None


def ready_model_dir(model: ModelSection, task: TaskSection, seed: int, run_dir: Path) -> Path | None:
    """The model directory to load when none must be built: `model.path` validated, the run's
    current RUN_DIR/model, or (copied into RUN_DIR/model) the user's cached build; None when the
    built-in model must be built (model/builtin.prepare_model does that). The arguments: builtin_key's."""
    if model.path:
        return validate_model_dir(model.path)
    target = Path(run_dir) / "model"
    key = builtin_key(model, task, seed)
    with file_lock(Path(run_dir) / "model.lock"):
        if is_current(target, key):
            return target
        cached = cache_dir()
        entry = cached / f"builtin-{key}" if cached is not None else None
        if entry is None:
            return None
        with file_lock(cached / f"builtin-{key}.lock"):  # type: ignore[operator]
            if not is_current(entry, key):
                return None
            tmp = Path(run_dir) / f".model-tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(entry, tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target
