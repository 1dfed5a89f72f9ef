"""The built-in tiny causal LM and model directories: prepare, load.

`prepare_model` returns a local Hugging Face directory (config.json, model.safetensors, tokenizer
files). A user model (`model.path`) is only validated, never downloaded. The built-in model is a
`Qwen2ForCausalLM` sized by the `model` section, randomly initialised from `run.seed`, warm-started
on `add` (see warmstart.py) and saved in RUN_DIR/model under a hash of everything that shapes it,
so every actor of a run (and a resumed run) loads the very same initial weights. A build is also
kept in the user's cache (`cache_dir()`), so the next run with the same settings copies it instead
of warm-starting again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

from prl_actors.config import Config, ConfigError
from prl_actors.model.device import resolve_dtype
from prl_actors.model.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer
from prl_actors.model.warmstart import warm_start, warm_start_on

BUILDER_VERSION = 1  # bump when the recipe below changes: cached models are then rebuilt
STAMP = "prl_builtin.json"
HF_LOAD_LOCK = threading.Lock()
"""Serialises `from_pretrained` within a process. transformers (5.x) disables weight tying during a
load by patching `PreTrainedModel.tie_weights` on the class, process-wide: two threads loading at
once (LocalCluster's actors) leave a tied lm_head untied on the meta device, and the racy restore can
disable tying for the rest of the process. Every load of ours goes through `from_pretrained` below."""
ATTN_IMPLEMENTATION = "sdpa"
"""Both "sdpa" and "eager" take the custom 4D float masks of training/packing.py (tests check it)."""


def builtin_key(cfg: Config) -> str:
    """Hash of everything that determines the built-in model's weights."""
    spec = {
        "builder": BUILDER_VERSION,
        "model": cfg.model.model_dump(exclude={"path", "dtype"}),
        "max_operand": cfg.task.max_operand,
        "seed": cfg.run.seed,
    }
    if cfg.task.name == "guess":  # warm-started on the game instead (other keys unchanged: caches stay valid)
        spec["guess"] = {"max": cfg.task.guess_max, "turns": cfg.task.max_turns}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def builtin_config(cfg: Config, vocab_size: int) -> Qwen2Config:
    m = cfg.model
    if m.hidden_size % m.heads:
        raise ConfigError(f"model.hidden_size ({m.hidden_size}) must be a multiple of model.heads ({m.heads})")
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=m.hidden_size,
        intermediate_size=4 * m.hidden_size,
        num_hidden_layers=m.layers,
        num_attention_heads=m.heads,
        num_key_value_heads=m.heads,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
    )


def create_builtin(cfg: Config, out_dir: Path, on_step: Callable[[int, int], None] | None = None) -> Path:
    """Build, warm-start and save the built-in model into `out_dir` (deterministic in run.seed);
    `on_step(done, total)` follows the warm start."""
    tok = build_tokenizer()
    torch.manual_seed(cfg.run.seed)
    model = Qwen2ForCausalLM(builtin_config(cfg, len(tok)))
    m = cfg.model
    with one_thread():  # a tiny model: OpenMP threads would mostly wait for each other (and on a busy host, far worse)
        if cfg.task.name == "guess":
            _warm_start_guess(cfg, model, tok, on_step)
        else:
            warm_start(
                model,
                tok,
                cfg.task.max_operand,
                m.warm_start_steps,
                cfg.run.seed,
                m.warm_start_smoothing,
                on_step=on_step,
            )
    model.generation_config.pad_token_id = PAD_ID
    with quiet_progress():
        model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    (out_dir / STAMP).write_text(json.dumps({"key": builtin_key(cfg)}))
    return out_dir


def _warm_start_guess(
    cfg: Config, model: PreTrainedModel, tok: PreTrainedTokenizerBase, on_step: Callable[[int, int], None] | None
) -> None:
    """The guess game's warm start: transcripts of a uniform-among-the-possible player (envs_llm/guess.py)."""
    from prl_actors.envs_llm.guess import warm_start_examples

    t, m = cfg.task, cfg.model
    examples = warm_start_examples(tok, t.guess_max, t.max_turns, 2048, cfg.run.seed)
    warm_start_on(model, tok, examples, m.warm_start_steps, cfg.run.seed, m.warm_start_smoothing, on_step=on_step)


def validate_model_dir(path: str) -> Path:
    """A user model must be a local directory with config.json (we never download)."""
    p = Path(path).expanduser()
    if not (p.is_dir() and (p / "config.json").is_file()):
        raise ConfigError(
            f"model.path {path!r} is not a local model directory with config.json "
            "(prl-actors never downloads models; save one with save_pretrained first)"
        )
    return p.resolve()


def _is_current(model_dir: Path, key: str) -> bool:
    try:
        return json.loads((model_dir / STAMP).read_text()).get("key") == key
    except (OSError, ValueError):
        return False


@contextmanager
def quiet_progress() -> Iterator[None]:
    """No HF progress bars on stderr while loading/saving (actor logs stay readable)."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread inside the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock, so actors of one run sharing a run_dir build the model once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prepare_model(cfg: Config, run_dir: Path, on_step: Callable[[int, int], None] | None = None) -> Path:
    """The model directory to load: `model.path` validated, or the built-in model in RUN_DIR/model
    (reused when its stamp matches `builtin_key(cfg)`, else copied from the user's cache, else
    built there and cached). Never downloads. `on_step` follows the warm start when one runs."""
    if cfg.model.path:
        return validate_model_dir(cfg.model.path)
    target = Path(run_dir) / "model"
    key = builtin_key(cfg)
    with _file_lock(Path(run_dir) / "model.lock"):
        if _is_current(target, key):
            return target
        tmp = Path(run_dir) / f".model-tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        cached = cache_dir()
        if cached is None:
            create_builtin(cfg, tmp, on_step)
        else:
            shutil.copytree(_cached_builtin(cfg, key, cached, on_step), tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


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


def _cached_builtin(cfg: Config, key: str, root: Path, on_step: Callable[[int, int], None] | None) -> Path:
    """The cached build of `key` (built once, under a lock, renamed into place when complete)."""
    entry = root / f"builtin-{key}"
    with _file_lock(root / f"builtin-{key}.lock"):
        if not _is_current(entry, key):
            tmp = root / f".builtin-{key}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            create_builtin(cfg, tmp, on_step)
            shutil.rmtree(entry, ignore_errors=True)
            tmp.rename(entry)
    return entry


def load_model(
    path: str | Path,
    device: torch.device | str = "cpu",
    dtype: str | torch.dtype = "float32",
    attn_implementation: str = ATTN_IMPLEMENTATION,
) -> PreTrainedModel:
    """A causal LM from a local directory, on `device`, in eval mode (no dropout), with the
    attention implementation whose custom-mask handling the packing tests verify."""
    model = from_pretrained(path, dtype=resolve_dtype(dtype), attn_implementation=attn_implementation)
    torch.nn.Module.to(model, device)  # in place (nn.Module.to returns self)
    return model.eval()


def from_pretrained(path: str | Path, **kwargs: object) -> PreTrainedModel:
    """`AutoModelForCausalLM.from_pretrained` on a local directory, one load at a time per process
    (see HF_LOAD_LOCK), without progress bars."""
    with HF_LOAD_LOCK, quiet_progress():
        model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, **kwargs)
    return model
