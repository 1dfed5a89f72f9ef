"""The vLLM engine's LoRA path for real (`make test-vllm`; skipped where vLLM is absent): adapters
published by the GRPO learner are served through vLLM's LoRA API (enable_lora, a LoRARequest per
version), and the sampled tokens' log-probs are those of the trainer's adapted policy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from prl_actors.engines.base import IncompatibleWeights
from prl_actors.engines.vllm_engine import VllmEngine
from prl_actors.launch import build
from prl_actors.launch.topology import learner_settings
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
    engine = build.engine(cfg, ckpt)
    assert isinstance(engine, VllmEngine)
    yield cfg, ckpt, engine
    engine.close()


def test_adapters_are_served_through_the_lora_api(setup) -> None:  # type: ignore[no-untyped-def]
    cfg, ckpt, engine = setup
    learner = GRPOLearner(learner_settings(cfg), ckpt)
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
        engine.load_weights(99, GRPOLearner(learner_settings(cfg), other).weights())
    assert engine.lora_request is before


def test_up_trains_a_lora_adapter_with_the_vllm_engine(tmp_path: Path) -> None:
    """`prl-actors up` with worker.engine vllm and trainer.lora, real OS processes: every published
    adapter version is served, the engine's log-probs stay those of the trainer's policy."""
    import json
    import subprocess
    import sys

    from tests.conftest import assert_invariants, port_base, read_logs

    ckpt = make_checkpoint(vllm_config(tmp_path), tmp_path / "ckpt")
    run_dir, epochs = tmp_path / "run", 3
    sets = {
        "run.epochs": epochs,
        "run.workers": 1,
        "transport.base_port": port_base(),
        "coordinator.groups_per_epoch": 4,
        "coordinator.heartbeat_interval_s": 0.5,
        "coordinator.heartbeat_timeout_s": 30.0,
        "worker.engine": "vllm",
        "worker.group_size": 8,
        "worker.gpu_memory_utilization": 0.1,
        "worker.weight_fetch_timeout_s": 120.0,
        "worker.sampling.max_new_tokens": 4,
        "task.reward": "tests.vllm_utils:digit_share",
        "model.path": str(ckpt),
        "model.warm_start_steps": 0,
    }
    argv = [
        sys.executable,
        "-m",
        "prl_actors.cli.main",
        "up",
        "--config",
        "configs/lora.yaml",
        "--run-dir",
        str(run_dir),
    ]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=420, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    assert_invariants(run_dir, epochs=epochs, groups=4)
    loaded = [e for e in read_logs(run_dir) if e["event"] == "span_end" and e.get("span") == "weight_sync"]
    assert {e["new_version"] for e in loaded} == set(range(epochs))
    assert all(e["bytes"] < 200_000 for e in loaded)  # adapters, not the model
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print([{k: r[k] for k in ("epoch", "reward_mean", "kl", "logprob_diff_max")} for r in rows])
    assert all(r["logprob_diff_max"] < TOL for r in rows) and rows[-1]["kl"] > 0
