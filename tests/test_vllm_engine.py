"""The optional vLLM engine: a clear error without vLLM; a real check where vLLM and a GPU exist."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from prl_actors.config import ConfigError
from prl_actors.engines.registry import make_engine
from tests.learning_utils import prompts, tiny_model

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is installed")
def test_missing_vllm_is_a_clear_error(tmp_path: Path) -> None:
    cfg, model_dir = tiny_model(tmp_path, worker__engine="vllm")
    with pytest.raises(ConfigError, match=r"vLLM is not installed; pip install prl-actors\[vllm\]"):
        make_engine(cfg, model_dir)


@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed")
@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM needs a GPU")
def test_vllm_engine_generates_and_swaps_weights(tmp_path: Path) -> None:
    from prl_actors.model.builtin import load_model

    cfg, model_dir = tiny_model(tmp_path, worker__engine="vllm")
    engine = make_engine(cfg, model_dir)
    state = load_model(model_dir).state_dict()
    engine.load_weights(1, state)
    assert engine.version == 1
    groups = engine.generate(prompts(["3+4=", "12+9="]), 4)
    assert [len(g.samples) for g in groups] == [4, 4]
    for s in (s for g in groups for s in g.samples):
        assert len(s.token_ids) == len(s.logprobs) >= 1
    engine.close()
