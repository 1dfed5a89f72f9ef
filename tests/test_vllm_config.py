"""The vLLM engine's settings, checked without vLLM (normal tier): config fields, dtype refusal, a
clear error where vLLM is missing, and a module that imports without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from prl_actors.config import load_config
from prl_actors.engines.vllm_engine import MISSING
from prl_actors.launch import build
from prl_actors.sections import ConfigError
from tests.learning_utils import tiny_model
from tests.test_cli import run_cli
from tests.vllm_utils import HAVE_VLLM


def test_vllm_settings_have_safe_defaults_and_bounds() -> None:
    w = load_config(None, {"worker.engine": "vllm"}).worker
    assert (w.gpu_memory_utilization, w.enforce_eager, w.max_model_len) == (0.25, True, None)
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ConfigError, match="worker.gpu_memory_utilization"):
            load_config(None, {"worker.gpu_memory_utilization": bad})
    with pytest.raises(ConfigError, match="worker.max_model_len"):
        load_config(None, {"worker.max_model_len": 0})


def test_float64_is_refused_for_vllm_only() -> None:
    with pytest.raises(ConfigError, match="worker.engine 'vllm' runs model.dtype float32 or bfloat16, not float64"):
        load_config(None, {"worker.engine": "vllm", "model.dtype": "float64"})
    assert load_config(None, {"worker.engine": "torch", "model.dtype": "float64"}).model.dtype == "float64"
    assert load_config(None, {"worker.engine": "vllm", "model.dtype": "bfloat16"}).model.dtype == "bfloat16"


def test_the_engine_module_imports_without_vllm() -> None:
    code = (
        "import sys; sys.modules['vllm'] = None\n"  # makes `import vllm` fail like a missing package
        "import prl_actors.engines.vllm_engine, prl_actors.engines.vllm_ext; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is installed")
def test_missing_vllm_is_a_clear_error(tmp_path: Path) -> None:
    cfg, model_dir = tiny_model(tmp_path, worker__engine="vllm")
    with pytest.raises(ConfigError, match=r"vLLM is not installed; pip install prl-actors\[vllm\]"):
        build.engine(cfg, model_dir)


@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is installed")
def test_up_without_vllm_stops_before_starting_workers(tmp_path: Path) -> None:
    _, model_dir = tiny_model(tmp_path / "m", worker__engine="vllm")
    code, out = run_cli(
        "up", "--run-dir", str(tmp_path / "run"), "--set", "worker.engine=vllm", "--set", f"model.path={model_dir}"
    )
    assert code == 2
    assert [line for line in out.splitlines() if line.startswith("error:")] == [f"error: {MISSING}"]


def test_tensor_parallel_size_must_divide_the_heads(tmp_path: Path) -> None:
    """worker.tensor_parallel_size reaches vllm.LLM (unverified beyond 1: no GPU); a split vLLM would
    refuse is refused first, in one line."""
    import json

    from prl_actors.engines.vllm_engine import check_tensor_parallel

    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 4}))
    check_tensor_parallel(1, tmp_path)
    with pytest.raises(ConfigError, match="tensor_parallel_size 3 does not divide the model's 4 attention heads"):
        check_tensor_parallel(3, tmp_path)


def test_every_sampling_control_maps_to_vllm_sampling_params() -> None:
    """worker.sampling -> SamplingParams kwargs (vLLM applies them in training/behaviour.py's order);
    checked without vLLM: the names are vLLM 0.32's SamplingParams fields."""
    from prl_actors.engines.vllm_engine import sampling_kwargs

    s = load_config(
        None,
        {
            "worker.sampling.temperature": 0.7,
            "worker.sampling.top_p": 0.9,
            "worker.sampling.top_k": 20,
            "worker.sampling.min_p": 0.05,
            "worker.sampling.repetition_penalty": 1.2,
            "worker.sampling.stop": ["\n\n", "</answer>"],
            "worker.sampling.max_new_tokens": 64,
        },
    ).worker.sampling
    assert sampling_kwargs(s, 8) == {
        "n": 8,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.2,
        "stop": ["\n\n", "</answer>"],
        "max_tokens": 64,
        "logprobs": 0,
    }
    off = sampling_kwargs(load_config(None, {}).worker.sampling, 4)
    assert (off["top_k"], off["min_p"], off["repetition_penalty"], off["stop"]) == (-1, 0.0, 1.0, None)
    if HAVE_VLLM:  # the real class takes them
        import vllm

        vllm.SamplingParams(**sampling_kwargs(s, 8), seed=1)
