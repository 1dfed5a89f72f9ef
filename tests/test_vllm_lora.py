"""The vLLM engine's LoRA path for real (`make test-vllm`; skipped where vLLM is absent): adapters
published by the GRPO learner are served through vLLM's LoRA API (enable_lora, a LoRARequest per
version), and the sampled tokens' log-probs are those of the trainer's adapted policy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from prl_actors.engines.base import IncompatibleWeights
from prl_actors.engines.registry import make_engine
from prl_actors.engines.vllm_engine import VllmEngine
from prl_actors.training.grpo import GRPOLearner
from tests.learning_utils import prompts, random_rewards
from tests.vllm_utils import make_checkpoint, max_logprob_diff, needs_vllm, vllm_config

pytestmark = [pytest.mark.vllm, needs_vllm, pytest.mark.timeout(900)]
LORA = {"r": 8, "alpha": 16.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}
TOL = 2e-4  # as tests/test_vllm_engine.py: float32 on both sides, other summation orders


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:  # type: ignore[type-arg]
    root = tmp_path_factory.mktemp("vllm-lora")
    cfg = vllm_config(root, trainer__lora=LORA, trainer__lr=0.05)
    ckpt = make_checkpoint(cfg, root / "ckpt", sharpen=20.0)
    engine = make_engine(cfg, ckpt)
    assert isinstance(engine, VllmEngine)
    yield cfg, ckpt, engine
    engine.close()


def test_adapters_are_served_through_the_lora_api(setup) -> None:  # type: ignore[no-untyped-def]
    cfg, ckpt, engine = setup
    learner = GRPOLearner(cfg, ckpt)
    engine.load_weights(0, learner.weights())
    texts = ["3+4=", "12+9=", "7+7="]
    groups = random_rewards(engine.generate(prompts(texts), 4))
    for epoch in range(2):
        learner.begin_epoch(epoch, len(groups))
        for g in groups:
            learner.accumulate(g)
        learner.step()
    engine.load_weights(learner.version, learner.weights())
    assert engine.lora_request is not None and engine.lora_request.lora_int_id == learner.version + 1
    fresh = engine.generate(prompts(texts), 4)
    policy = learner.policy.eval()
    diff, tokens = max_logprob_diff(policy, fresh, 1.0, 1.0)
    print(f"vLLM LoRA vs trainer: max |diff| = {diff:.2e} over {tokens} tokens")
    assert tokens >= 12 and diff < TOL
    with torch.no_grad(), policy.disable_adapter():  # the adapter really changed what vLLM computes
        base_diff, _ = max_logprob_diff(policy, fresh, 1.0, 1.0)
    assert base_diff > 10 * TOL


def test_an_adapter_of_another_base_is_refused(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg, _, engine = setup
    other = make_checkpoint(vllm_config(tmp_path, run__seed=5), tmp_path / "other", sharpen=20.0)
    before = engine.lora_request
    with pytest.raises(IncompatibleWeights, match="another base model"):
        engine.load_weights(99, GRPOLearner(cfg, other).weights())
    assert engine.lora_request is before
