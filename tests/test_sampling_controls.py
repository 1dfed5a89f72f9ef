"""Generation controls (worker.sampling top_k, min_p, repetition_penalty, stop): the transform by
hand and against Hugging Face's processors, engine == trainer per token for every combination
(through the real torch engine and the trainer's scoring), and stop strings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

from prl_actors.config import load_config
from prl_actors.engines.stops import cut_at_stop
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.launch import build
from prl_actors.launch.topology import learner_settings
from prl_actors.sections import ConfigError
from prl_actors.training.behaviour import (
    Behaviour,
    behaviour_logprobs,
    context_matrix,
    penalise,
    response_contexts,
    shaped_logits,
)
from prl_actors.training.grpo import GRPOLearner
from tests.learning_utils import prompts, random_rewards, tiny_config, tiny_model

pytestmark = pytest.mark.fast

TEXTS = ["3+4=", "12+19=", "7+15=", "0+0=", "20+1=", "9+9="]
ATOL = 1e-5  # float32 engine vs trainer (measured ~1e-6, as for temperature / top_p alone)

COMBOS = {
    "top_k": {"top_k": 3},
    "min_p": {"min_p": 0.1},
    "repetition_penalty": {"repetition_penalty": 1.8},
    "penalty_below_one": {"repetition_penalty": 0.6},
    "all": {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.3},
}


# --- the transform by hand ---------------------------------------------------------------------------


def test_repetition_penalty_is_hf_semantics() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 20, generator=gen) * 3  # [N, V], both signs
    contexts = [[1, 5, 5, 7], [0], [19, 3, 4, 3, 2, 11]]
    for penalty in (1.5, 0.7):
        ours = penalise(logits, context_matrix(contexts), penalty)
        for i, c in enumerate(contexts):  # HF's processor, one row at a time (its input_ids: [1, len])
            hf = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([c]), logits[i : i + 1].clone())
            assert torch.equal(ours[i : i + 1], hf)
    by_hand = logits.clone()
    by_hand[0, [1, 5, 7]] = torch.where(logits[0, [1, 5, 7]] > 0, logits[0, [1, 5, 7]] / 2, logits[0, [1, 5, 7]] * 2)
    assert torch.equal(penalise(logits, context_matrix(contexts), 2.0)[0], by_hand[0])


def test_top_k_and_min_p_keep_what_hf_keeps() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 30, generator=gen) * 2
    T = 0.8
    scaled = TemperatureLogitsWarper(T)(None, logits.clone())  # type: ignore[arg-type]
    hf_k = TopKLogitsWarper(4)(None, scaled.clone())  # type: ignore[arg-type]
    assert torch.equal(shaped_logits(logits, Behaviour(T, top_k=4)).isinf(), hf_k.isinf())
    hf_min_p = MinPLogitsWarper(0.2)(None, scaled.clone())  # type: ignore[arg-type]
    assert torch.equal(shaped_logits(logits, Behaviour(T, min_p=0.2)).isinf(), hf_min_p.isinf())


def test_logprobs_hand_computed_with_every_control() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 1.6]])
    b = Behaviour(temperature=0.5, top_p=0.95, top_k=3, min_p=0.05, repetition_penalty=2.0)
    context = context_matrix([[0, 3]])  # token 0 (positive: / 2) and 3 (negative: * 2) were seen
    z = torch.tensor([1.0, 1.0, 0.5, -2.0, 1.6]) / 0.5  # penalised, tempered
    # min_p 0.05 of the top drops token 3; top_k 3 keeps {4, 0, 1} (0 and 1 tie at the 3rd value: both)
    kept = torch.tensor([0, 1, 4])
    p = torch.softmax(z[kept], -1)  # the top-p nucleus at 0.95 of these keeps all three here
    for i, token in enumerate(kept.tolist()):
        got = behaviour_logprobs(logits, torch.tensor([token]), b, context=context)
        assert got.item() == pytest.approx(torch.log(p[i]).item(), rel=1e-6)
    with pytest.raises(ValueError, match="context"):
        behaviour_logprobs(logits, torch.tensor([0]), b)


def test_response_contexts_are_prompt_plus_the_tokens_before() -> None:
    ctx = response_contexts([([1, 7], [[4, 5, 6], [9]]), ([3], [[8, 8]])])
    rows = [[t for t in row if t] for row in ctx.tolist()]
    firsts = [1, 1, 1, 1, 3, 3]  # padding repeats the prompt's first token
    assert [sorted(set(r)) for r in rows] == [[1, 7], [1, 4, 7], [1, 4, 5, 7], [1, 7], [3], [3, 8]]
    assert all(row[0] == f for row, f in zip(ctx.tolist(), firsts, strict=True))


def test_config_bounds() -> None:
    s = load_config(None, {}).worker.sampling
    assert (s.top_k, s.min_p, s.repetition_penalty, s.stop) == (0, 0.0, 1.0, [])
    for key, bad in (("top_k", -1), ("min_p", 1.5), ("repetition_penalty", 0), ("stop", [""])):
        with pytest.raises(ConfigError, match=f"worker.sampling.*{key}"):
            load_config(None, {f"worker.sampling.{key}": bad})


# --- engine == trainer, every combination ---------------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("controls"))[1]


@pytest.mark.parametrize("combo", list(COMBOS))
def test_engine_and_trainer_agree_per_token(model: Path, combo: str) -> None:
    """The engine's reported log-probs and the trainer's (GRPOLearner's own scoring, its epoch metric
    logprob_diff_max) agree at float noise; scoring without the control is far off."""
    cfg = tiny_config(**{f"worker__sampling__{k}": v for k, v in COMBOS[combo].items()})
    cfg = cfg.model_copy(deep=True)
    cfg.worker.sampling.max_new_tokens = 8
    engine = TorchEngine(build.engine_settings(cfg), model)
    engine.version = 0
    groups = random_rewards(engine.generate(prompts(TEXTS), 8))
    assert sum(len(s.token_ids) for g in groups for s in g.samples) > len(groups) * 8
    learner = GRPOLearner(learner_settings(cfg), model)
    learner.begin_epoch(0, len(groups))
    for g in groups:
        learner.accumulate(g)
    metrics = learner.step()
    assert metrics["logprob_diff_max"] < ATOL, combo
    plain = load_config(None, {}).worker.sampling.model_copy(update={"max_new_tokens": 8})
    off = GRPOLearner(
        learner_settings(cfg.model_copy(update={"worker": cfg.worker.model_copy(update={"sampling": plain})})), model
    )
    off.begin_epoch(0, len(groups))
    for g in groups:
        off.accumulate(g)
    assert off.step()["logprob_diff_max"] > 100 * ATOL, combo  # the control really shaped the samples


def test_repetition_penalty_changes_what_is_sampled(model: Path) -> None:
    """A strong penalty makes a repeated token rarer (the samples are not those of the plain engine)."""
    rates = []
    for penalty in (1.0, 5.0):
        cfg = tiny_config(worker__sampling__repetition_penalty=penalty)
        cfg.worker.sampling.max_new_tokens = 8
        engine = TorchEngine(build.engine_settings(cfg), model)
        engine.version = 0
        samples = [s for g in engine.generate(prompts(TEXTS), 16) for s in g.samples]
        repeats = sum(s.token_ids[j] in s.token_ids[:j] for s in samples for j in range(1, len(s.token_ids)))
        rates.append(repeats / max(1, sum(len(s.token_ids) - 1 for s in samples)))
    assert rates[1] < rates[0]


# --- stop strings -----------------------------------------------------------------------------------


def test_cut_at_stop() -> None:
    assert cut_at_stop("12+3=15 4", ["5", " "]) == "12+3=1"
    assert cut_at_stop("abc", ["x"]) == "abc"
    assert cut_at_stop("abc", []) == "abc"


def test_stop_strings_end_the_response_at_the_first_one(model: Path) -> None:
    cfg = tiny_config()
    cfg.worker.sampling.max_new_tokens = 8
    plain = TorchEngine(build.engine_settings(cfg), model)
    plain.version = 0
    before = [s for g in plain.generate(prompts(TEXTS), 8) for s in g.samples]
    stop = ["1", "+"]
    assert any(any(x in s.text for x in stop) for s in before)  # the stop strings do occur without stop
    cfg.worker.sampling.stop = stop
    engine = TorchEngine(build.engine_settings(cfg), model)
    engine.version = 0
    after = [s for g in engine.generate(prompts(TEXTS), 8) for s in g.samples]
    stopped = 0
    for s_plain, s in zip(before, after, strict=True):
        full = engine.tokenizer.decode(s.token_ids, skip_special_tokens=True)
        assert not any(x in s.text for x in stop) and full.startswith(s.text)
        assert not any(x in engine.tokenizer.decode(s.token_ids[:-1]) for x in stop)  # ends at the first
        assert len(s.token_ids) == len(s.logprobs)
        assert s.token_ids == s_plain.token_ids[: len(s.token_ids)]  # the same draws, cut
        if any(x in full for x in stop):
            stopped += 1
            assert s.finished and len(s.token_ids) <= len(s_plain.token_ids)
    assert stopped > 0


def test_the_penalty_passes_each_gradient_once_whatever_the_padding() -> None:
    """A token repeated in the context (or padding, which repeats the first token) must not multiply
    its gradient: the penalised logit is a function of the logit, once (fails with a scatter of the
    gathered values, whose backward sums over duplicates)."""
    logits = torch.randn(2, 10, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    weights = torch.randn(2, 10, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    grads = []
    for contexts in ([[1, 4], [2]], [[1, 4, 4, 1, 1], [2, 2, 2, 2, 2]]):  # the same sets, padded differently
        x = logits.clone().requires_grad_(True)
        (penalise(x, context_matrix(contexts), 1.7) * weights).sum().backward()
        assert x.grad is not None
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    expected = weights.clone()
    for row, seen in ((0, [1, 4]), (1, [2])):
        for t in seen:
            expected[row, t] *= 1 / 1.7 if logits[row, t] > 0 else 1.7
    torch.testing.assert_close(grads[0], expected)


def test_micro_batching_does_not_change_the_update_with_a_penalty(model: Path) -> None:
    """float64: one group per micro-batch in one order == all groups at once in another."""
    cfg = tiny_config(worker__sampling__repetition_penalty=1.5, model__dtype="float64")
    cfg.worker.sampling.max_new_tokens = 6
    engine = TorchEngine(build.engine_settings(cfg), model)
    engine.version = 0
    groups = random_rewards(engine.generate(prompts(TEXTS[:4]), 4))
    weights = []
    for micro, order in ((1, [0, 1, 2, 3]), (4, [3, 1, 0, 2])):
        c = cfg.model_copy(deep=True)
        c.trainer.micro_batch_groups = micro
        learner = GRPOLearner(learner_settings(c), model)
        for epoch in range(2):
            learner.begin_epoch(epoch, 4)
            for i in order:
                learner.accumulate(groups[i])
            learner.step()
        weights.append({k: v.clone() for k, v in learner.policy.state_dict().items()})
    for k in weights[0]:
        torch.testing.assert_close(weights[0][k], weights[1][k], atol=1e-12, rtol=1e-10, msg=k)
