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

import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

from prl_actors.model.device import resolve_dtype

# the torch-free half (key, cache, validation), re-exported here
from prl_actors.model.dirs import BUILDER_VERSION as BUILDER_VERSION
from prl_actors.model.dirs import STAMP as STAMP
from prl_actors.model.dirs import builtin_key as builtin_key
from prl_actors.model.dirs import cache_dir as cache_dir
from prl_actors.model.dirs import file_lock as _file_lock
from prl_actors.model.dirs import is_current as _is_current
from prl_actors.model.dirs import ready_model_dir as ready_model_dir
from prl_actors.model.dirs import validate_model_dir as validate_model_dir
from prl_actors.model.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer
from prl_actors.model.warmstart import warm_start, warm_start_on
from prl_actors.sections import ConfigError

if TYPE_CHECKING:
    from prl_actors.model.config import ModelSection
    from prl_actors.tasks.config import TaskSection

HF_LOAD_LOCK = threading.Lock()
"""Serialises `from_pretrained` within a process. transformers (5.x) disables weight tying during a
load by patching `PreTrainedModel.tie_weights` on the class, process-wide: two threads loading at
once (LocalCluster's actors) leave a tied lm_head untied on the meta device, and the racy restore can
disable tying for the rest of the process. Every load of ours goes through `from_pretrained` below."""
ATTN_IMPLEMENTATION = "sdpa"
"""Both "sdpa" and "eager" take the custom 4D float masks of training/packing.py (tests check it)."""


def builtin_config(m: ModelSection, vocab_size: int) -> Qwen2Config:
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


def create_builtin(
    m: ModelSection, t: TaskSection, seed: int, out_dir: Path, on_step: Callable[[int, int], None] | None = None
) -> Path:
    """Build, warm-start (on task `t`) and save the built-in model of section `m` into `out_dir`
    (deterministic in `seed`, run.seed); `on_step(done, total)` follows the warm start."""
    tok = build_tokenizer()
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(builtin_config(m, len(tok)))
    with one_thread():  # a tiny model: OpenMP threads would mostly wait for each other (and on a busy host, far worse)
        if t.name == "guess":
            _warm_start_guess(m, t, seed, model, tok, on_step)
        else:
            warm_start(
                model,
                tok,
                t.max_operand,
                m.warm_start_steps,
                seed,
                m.warm_start_smoothing,
                on_step=on_step,
            )
    model.generation_config.pad_token_id = PAD_ID
    with quiet_progress():
        model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    (out_dir / STAMP).write_text(json.dumps({"key": builtin_key(m, t, seed)}))
    return out_dir


def _warm_start_guess(
    m: ModelSection,
    t: TaskSection,
    seed: int,
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    on_step: Callable[[int, int], None] | None,
) -> None:
    """The guess game's warm start: transcripts of a uniform-among-the-possible player (envs_llm/guess.py)."""
    from prl_actors.envs_llm.guess import warm_start_examples

    examples = warm_start_examples(tok, t.guess_max, t.max_turns, 2048, seed)
    warm_start_on(model, tok, examples, m.warm_start_steps, seed, m.warm_start_smoothing, on_step=on_step)


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


def prepare_model(
    m: ModelSection, t: TaskSection, seed: int, run_dir: Path, on_step: Callable[[int, int], None] | None = None
) -> Path:
    """The model directory to load: `model.path` validated, or the built-in model of section `m`,
    warm-started on task `t` from `seed` (run.seed), in RUN_DIR/model (reused when its stamp matches
    `builtin_key(m, t, seed)`, else copied from the user's cache, else built there and cached). Never
    downloads. `on_step` follows the warm start when one runs."""
    ready = ready_model_dir(m, t, seed, run_dir)
    if ready is not None:
        return ready
    target = Path(run_dir) / "model"
    key = builtin_key(m, t, seed)
    with _file_lock(Path(run_dir) / "model.lock"):
        if _is_current(target, key):
            return target
        tmp = Path(run_dir) / f".model-tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        cached = cache_dir()
        if cached is None:
            create_builtin(m, t, seed, tmp, on_step)
        else:
            shutil.copytree(_cached_builtin(m, t, seed, key, cached, on_step), tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


def _cached_builtin(
    m: ModelSection, t: TaskSection, seed: int, key: str, root: Path, on_step: Callable[[int, int], None] | None
) -> Path:
    """The cached build of `key` (built once, under a lock, renamed into place when complete)."""
    entry = root / f"builtin-{key}"
    with _file_lock(root / f"builtin-{key}.lock"):
        if not _is_current(entry, key):
            tmp = root / f".builtin-{key}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            create_builtin(m, t, seed, tmp, on_step)
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
