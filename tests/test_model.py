"""The built-in model directory: an ordinary, offline-loadable HF checkpoint, cached per config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from prl_actors.launch import build
from prl_actors.model.device import resolve_device
from prl_actors.model.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer
from prl_actors.sections import ConfigError
from tests.learning_utils import tiny_config

pytestmark = pytest.mark.fast


def test_tokenizer_round_trip() -> None:
    tok = build_tokenizer()
    ids = tok("12+7=").input_ids
    assert ids[0] == BOS_ID and len(ids) == 6
    assert tok.decode(ids, skip_special_tokens=True) == "12+7="
    assert tok.decode([*tok("19", add_special_tokens=False).input_ids, EOS_ID], skip_special_tokens=True) == "19"
    assert (tok.pad_token_id, tok.eos_token_id) == (PAD_ID, EOS_ID)


def test_prepare_model_writes_a_loadable_hf_directory(tmp_path: Path) -> None:
    cfg = tiny_config(model__warm_start_steps=5)
    model_dir = build.model_dir(cfg, tmp_path)
    assert model_dir == tmp_path / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (model_dir / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    out = model(input_ids=torch.tensor([tok("3+4=").input_ids]))
    assert out.logits.shape == (1, 5, len(tok))


def test_prepare_model_reuses_and_rebuilds(tmp_path: Path) -> None:
    cfg = tiny_config()
    first = build.model_dir(cfg, tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert build.model_dir(cfg, tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # reused
    weights = (first / "model.safetensors").read_bytes()
    build.model_dir(tiny_config(run__seed=5), tmp_path)  # another seed: rebuilt in place
    assert (first / "model.safetensors").read_bytes() != weights


def test_same_config_gives_identical_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRL_CACHE_DIR", "")  # two builds, not a build and its cached copy
    cfg = tiny_config()
    a = build.model_dir(cfg, tmp_path / "a") / "model.safetensors"
    b = build.model_dir(cfg, tmp_path / "b") / "model.safetensors"
    assert a.read_bytes() == b.read_bytes()


def test_user_model_path(tmp_path: Path) -> None:
    built = build.model_dir(tiny_config(), tmp_path)
    assert build.model_dir(tiny_config(model__path=str(built)), tmp_path / "other") == built.resolve()
    with pytest.raises(ConfigError, match="not a local model directory"):
        build.model_dir(tiny_config(model__path=str(tmp_path / "missing")), tmp_path)
    with pytest.raises(ConfigError, match="never downloads"):
        build.model_dir(tiny_config(model__path="Qwen/Qwen2.5-0.5B"), tmp_path)


def test_bad_shape_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="multiple of model.heads"):
        build.model_dir(tiny_config(model__hidden_size=30, model__heads=4), tmp_path)


def test_devices() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="unknown device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda")
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="torch-npu"):
            resolve_device("npu")


def test_a_built_in_model_is_built_once_per_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second run dir with the same settings copies the cached build (no warm start); other
    settings build anew; PRL_CACHE_DIR="" turns the cache off."""
    from prl_actors.model import builtin

    monkeypatch.setenv("PRL_CACHE_DIR", str(tmp_path / "cache"))
    builds: list[int] = []
    real = builtin.create_builtin
    monkeypatch.setattr(builtin, "create_builtin", lambda *a, **k: builds.append(1) or real(*a, **k))
    a = build.model_dir(tiny_config(), tmp_path / "a") / "model.safetensors"
    b = build.model_dir(tiny_config(), tmp_path / "b") / "model.safetensors"
    assert len(builds) == 1 and a.read_bytes() == b.read_bytes() and a != b
    build.model_dir(tiny_config(run__seed=5), tmp_path / "c")
    assert len(builds) == 2
    monkeypatch.setenv("PRL_CACHE_DIR", "")
    build.model_dir(tiny_config(), tmp_path / "d")
    assert len(builds) == 3
