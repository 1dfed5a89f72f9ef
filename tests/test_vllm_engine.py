"""The vLLM engine for real (`make test-vllm`; skipped where vLLM is absent): its behaviour log-probs
equal a torch forward of the weights it was given, under the same temperature / top-p transform, and
a weight update really replaces the weights (a no-op load fails these tests).

One LLM is shared by the module (vLLM takes ~1 minute to start on CPU)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from prl_actors.engines.config import SamplingSection
from prl_actors.engines.vllm_engine import VllmEngine, check_vllm_setup
from prl_actors.launch import build
from prl_actors.model.builtin import load_model
from prl_actors.sections import ConfigError
from tests.learning_utils import prompts
from tests.vllm_utils import make_checkpoint, max_logprob_diff, needs_vllm, vllm_config

pytestmark = [pytest.mark.vllm, needs_vllm, pytest.mark.timeout(900)]  # vLLM starts in ~1 min

TOL = 2e-4
"""float32 on both sides; vLLM's CPU attention and matmuls sum in another order than torch's sdpa.
Measured max |diff| <= 5e-6 (docs/ENGINES.md); the weight change of these tests moves them by ~5."""
LONG = "+".join(str(i) for i in range(60)) + "="
"""171 prompt tokens: more than one KV block (128 on CPU), so vLLM's prefix cache holds it across
calls; without the reset after a weight swap the old weights' KV would be reused."""
TEXTS = ["3+4=", "12+9=", "7+7=", LONG]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vllm")
    return make_checkpoint(vllm_config(root), root / "ckpt", sharpen=20.0)


@pytest.fixture(scope="module")
def engine(ckpt: Path) -> Iterator[VllmEngine]:
    eng = build.engine(vllm_config(ckpt.parent), ckpt)
    assert isinstance(eng, VllmEngine)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def weights(ckpt: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(model A = the checkpoint, model B = A with every tensor perturbed): two different policies."""
    a = load_model(ckpt)
    b = load_model(ckpt)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in b.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3 * p.std())
    return a, b


def sample(engine: VllmEngine, temperature: float = 1.0, top_p: float = 1.0) -> list:  # type: ignore[type-arg]
    engine.sampling = SamplingSection(temperature=temperature, top_p=top_p, max_new_tokens=6)
    return engine.generate(prompts(TEXTS), 4)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.5, 0.9), (1.5, 0.7)])
def test_logprobs_are_those_of_the_loaded_weights_under_the_sampling_transform(
    engine: VllmEngine, weights: tuple[torch.nn.Module, torch.nn.Module], temperature: float, top_p: float
) -> None:
    a, _ = weights
    engine.load_weights(1, a.state_dict())
    groups = sample(engine, temperature, top_p)
    assert [len(g.samples) for g in groups] == [4] * len(TEXTS)
    diff, tokens = max_logprob_diff(a, groups, temperature, top_p)
    print(f"T={temperature} top_p={top_p}: max |vLLM - torch| = {diff:.2e} over {tokens} tokens")
    assert tokens >= 16 and diff < TOL
    if top_p < 1.0:  # the nucleus renormalisation is in: raw log-probs would differ
        raw, _ = max_logprob_diff(a, groups, 1.0, 1.0)
        assert raw > 10 * TOL


@pytest.mark.parametrize(
    "controls",
    [
        {"top_k": 5},
        {"min_p": 0.05},
        {"repetition_penalty": 1.8},
        {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.02, "repetition_penalty": 1.3},
    ],
)
def test_logprobs_under_the_new_sampling_controls_are_the_trainers_transform(
    engine: VllmEngine, weights: tuple[torch.nn.Module, torch.nn.Module], controls: dict[str, float]
) -> None:
    """top_k, min_p and repetition_penalty reach vLLM's SamplingParams, and vLLM's processed log-probs
    equal the trainer's one transform (training/behaviour.py) on a torch forward of the same weights,
    token by token, each token scored with its own context for the penalty."""
    from prl_actors.training.behaviour import Behaviour, behaviour_logprobs, context_matrix

    a, _ = weights
    engine.load_weights(1, a.state_dict())
    settings = {"temperature": 1.0, **controls}
    engine.sampling = SamplingSection(max_new_tokens=6, **settings)
    behaviour = Behaviour.of(engine.sampling)
    worst, count = 0.0, 0
    with torch.no_grad():
        for g in engine.generate(prompts(TEXTS), 4):
            for s in g.samples:
                ids = torch.tensor([g.prompt_ids + s.token_ids])  # [1, P + R]
                logits = a(input_ids=ids).logits[0, len(g.prompt_ids) - 1 : -1].double()  # [R, V]
                contexts = [g.prompt_ids + s.token_ids[:i] for i in range(len(s.token_ids))]
                ref = behaviour_logprobs(logits, torch.tensor(s.token_ids), behaviour, context=context_matrix(contexts))
                got = torch.tensor(s.logprobs, dtype=torch.float64)
                worst, count = max(worst, (ref - got).abs().max().item()), count + len(s.token_ids)
    print(f"{controls}: max |vLLM - trainer transform| = {worst:.2e} over {count} tokens")
    assert count >= 16 and worst < TOL


def test_a_weight_update_replaces_the_weights_in_place(
    engine: VllmEngine, weights: tuple[torch.nn.Module, torch.nn.Module]
) -> None:
    a, b = weights
    engine.load_weights(1, a.state_dict())
    engine.load_weights(2, b.state_dict())
    assert engine.version == 2
    on_b = sample(engine)
    assert max_logprob_diff(b, on_b, 1.0, 1.0)[0] < TOL
    stale, _ = max_logprob_diff(a, on_b, 1.0, 1.0)
    print(f"after the update, max |vLLM - torch(old weights)| = {stale:.3f}")
    assert stale > 0.1  # the old weights do not explain the new outputs
    engine.load_weights(3, a.state_dict())  # and back: the same prompts (prefix cache reset) under A
    assert max_logprob_diff(a, sample(engine), 1.0, 1.0)[0] < TOL


def test_a_bad_update_is_refused_and_keeps_the_old_weights(
    engine: VllmEngine, weights: tuple[torch.nn.Module, torch.nn.Module]
) -> None:
    a, b = weights
    engine.load_weights(1, a.state_dict())
    bad = dict(b.state_dict())
    bad.pop("model.norm.weight")
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        engine.load_weights(2, bad)
    wrong = dict(b.state_dict())
    wrong["lm_head.weight"] = wrong["lm_head.weight"][:-1]
    with pytest.raises(ValueError, match="lm_head.weight has shape"):
        engine.load_weights(2, wrong)
    assert engine.version == 1
    assert max_logprob_diff(a, sample(engine), 1.0, 1.0)[0] < TOL


def test_greedy_logprobs_are_zero_and_answers_repeat(engine: VllmEngine) -> None:
    groups = sample(engine, temperature=0.0)
    for g in groups:
        assert len({tuple(s.token_ids) for s in g.samples}) == 1
        assert all(lp == 0.0 for s in g.samples for lp in s.logprobs)


def test_unsupported_setups_are_refused_in_one_line(tmp_path: Path, ckpt: Path) -> None:
    cfg = vllm_config(tmp_path, model__hidden_size=64, model__heads=4, model__warm_start_steps=0)
    small = make_checkpoint(cfg, tmp_path / "hd16")
    with pytest.raises(ConfigError, match=r"vLLM's CPU attention supports head sizes \[32, 64.*the model has 16"):
        check_vllm_setup(cfg.worker, small)
    with pytest.raises(ConfigError, match="worker.device is 'cuda' but the installed vLLM build runs on 'cpu'"):
        check_vllm_setup(vllm_config(tmp_path, worker__device="cuda").worker, small)
    with pytest.raises(ConfigError, match=r"worker.gpu_memory_utilization 0.6 x 2 worker\(s\) reserves .* lower it"):
        check_vllm_setup(vllm_config(tmp_path, worker__gpu_memory_utilization=0.6).worker, ckpt, workers=2)
