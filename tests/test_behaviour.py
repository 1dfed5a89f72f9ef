"""The behaviour distribution: engines report, and the trainer scores, log q(token) with q the tempered,
top-p-truncated distribution the token was really drawn from (training/behaviour.py)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from msgspec.structs import replace
from typer.testing import CliRunner

from prl_actors.cli.main import app
from prl_actors.config import Config, load_config
from prl_actors.engines.sampling import top_p_filter
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.launch import build
from prl_actors.launch.topology import learner_settings
from prl_actors.protocol.messages import Group
from prl_actors.sections import ConfigError
from prl_actors.training.behaviour import behaviour_logprobs, nucleus_mask
from prl_actors.training.grpo import GRPOLearner
from prl_actors.training.packing import collate_packed, response_logprobs
from prl_actors.training.trimodel import TriModel
from tests.learning_utils import prompts, random_rewards, tiny_model

TEXTS = ["3+4=", "12+19=", "7+15=", "0+0=", "20+1=", "9+9="]
T, TOP_P = 0.5, 0.9
ATOL = 1e-5
"""Engine vs trainer in float32: the same weights and transform, only the forward differs (KV-cached
left-padded batch vs packed rows), measured <= 1e-6; the old raw-log_softmax convention was off by
up to ~1.1 at T = 0.5 / top_p = 0.9."""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path, list[Group]]:
    cfg, model_dir = tiny_model(
        tmp_path_factory.mktemp("behaviour"), worker__sampling__temperature=T, worker__sampling__top_p=TOP_P
    )
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    return cfg, model_dir, random_rewards(engine.generate(prompts(TEXTS), 8))


def flat(groups: list[Group]) -> torch.Tensor:
    return torch.tensor([lp for g in groups for s in g.samples for lp in s.logprobs], dtype=torch.float64)


def batch_of(groups: list[Group]):  # type: ignore[no-untyped-def]
    return collate_packed([(g.prompt_ids, [s.token_ids for s in g.samples]) for g in groups])


# --- the transform by hand ---------------------------------------------------------------------


def test_nucleus_is_the_set_top_p_filter_samples_from() -> None:
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3]])
    assert nucleus_mask(probs, 0.7).tolist() == [[False, True, False, True]]
    assert nucleus_mask(probs, 0.8).tolist() == [[False, True, False, True]]  # mass 0.8 >= 0.8
    assert nucleus_mask(probs, 0.81).tolist() == [[True, True, False, True]]
    assert nucleus_mask(probs, 1e-9).tolist() == [[False, True, False, False]]  # the top token stays
    rand = torch.softmax(3 * torch.randn(64, 50, generator=torch.Generator().manual_seed(0)), dim=-1)
    for top_p in (0.3, 0.9, 0.99, 1.0):
        assert torch.equal(nucleus_mask(rand, top_p), top_p_filter(rand, top_p) > 0)


def test_behaviour_logprobs_hand_computed() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.0, 1.5]])
    p = [math.exp(z / T) for z in (1.0, 2.0, 0.0, 1.5)]
    p = [x / sum(p) for x in p]  # tempered: 0.089, 0.657, 0.012, 0.242 -> nucleus (0.7) = {1, 3}
    for target, expected in ((1, math.log(p[1] / (p[1] + p[3]))), (3, math.log(p[3] / (p[1] + p[3])))):
        got = behaviour_logprobs(logits, torch.tensor([target]), T, 0.7)
        assert got.item() == pytest.approx(expected, rel=1e-6)
    raw = behaviour_logprobs(logits, torch.tensor([3]), 1.0, 1.0)
    assert torch.equal(raw, torch.log_softmax(logits, -1)[:, 3])  # T = 1, top_p = 1: the raw log_softmax
    assert behaviour_logprobs(logits, torch.tensor([2]), 0.0, 1.0).item() == 0.0  # greedy: a point mass


def test_a_target_outside_the_nucleus_is_finite_with_a_finite_gradient() -> None:
    """The trainer's logits differ from the engine's by float noise, so a sampled token can fall just
    outside the trainer's nucleus: it is added to the set, never scored -inf."""
    logits = torch.tensor([[1.0, 2.0, 0.0, 1.5]], requires_grad=True)
    lp = behaviour_logprobs(logits, torch.tensor([0]), T, 0.7)  # token 0 is not in the nucleus {1, 3}
    p = [math.exp(z / T) for z in (1.0, 2.0, 1.5)]
    assert lp.item() == pytest.approx(math.log(p[0] / sum(p)), rel=1e-6)
    lp.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert logits.grad[0, 2].item() == 0.0  # outside the set: no gradient


# --- engine == trainer -------------------------------------------------------------------------


def test_engine_logprobs_are_the_distribution_tokens_were_drawn_from(setup) -> None:
    """2000 first tokens at T = 0.5 / top_p = 0.9: each token's share matches exp(reported logprob)
    within 4 standard errors. The raw (0.344) and the tempered-but-untruncated (0.791) probabilities
    of "3+4="'s top token are far from its share (0.873)."""
    cfg, model_dir, _ = setup
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    engine.sampling = cfg.worker.sampling.model_copy(update={"max_new_tokens": 1})
    n = 2000
    for group in engine.generate(prompts(["3+4=", "12+19=", "7+15="]), n):
        counts = Counter(s.token_ids[0] for s in group.samples)
        reported = {s.token_ids[0]: math.exp(s.logprobs[0]) for s in group.samples}
        assert sum(reported.values()) == pytest.approx(1.0, abs=1e-5)  # q is renormalised on the nucleus
        for token, count in counts.items():
            q = reported[token]
            assert abs(count / n - q) < 4 * math.sqrt(q * (1 - q) / n) + 1e-3, (group.prompt, token)
    top = Counter(s.token_ids[0] for s in engine.generate(prompts(["3+4="]), n)[0].samples).most_common(1)[0]
    logits = engine.model(input_ids=torch.tensor([engine.tokenizer("3+4=").input_ids])).logits[0, -1]
    for untruncated in (torch.softmax(logits, -1), torch.softmax(logits / T, -1)):
        assert abs(untruncated[top[0]].item() - top[1] / n) > 0.05


def test_engine_and_trainer_agree_and_the_ratio_is_one(setup) -> None:
    cfg, model_dir, groups = setup
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    with torch.no_grad():
        out = learner.tri(batch_of(groups))
    engine = flat(groups)
    assert engine.numel() > len(groups) * 8  # responses longer than one token
    diff = (engine - out.policy.double()).abs()
    assert diff.max().item() < ATOL
    assert torch.equal(torch.exp(out.policy - out.old), torch.ones_like(out.policy))
    with torch.no_grad():  # the old convention (raw log_softmax) is far outside that tolerance
        raw = response_logprobs(learner.policy, batch_of(groups)).double()
    assert (engine - raw).abs().max().item() > 100 * ATOL
    assert (engine - raw).abs().mean().item() > 10 * ATOL


def test_reference_scores_with_the_same_transform(setup) -> None:
    cfg, model_dir, groups = setup
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    tri = TriModel(learner.policy, with_reference=True, temperature=T, top_p=TOP_P)
    with torch.no_grad():
        out = tri(batch_of(groups))
    assert out.ref is not None and torch.equal(out.ref, out.policy)


def test_epoch_metrics_report_the_engine_trainer_mismatch(setup) -> None:
    cfg, model_dir, groups = setup
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    learner.begin_epoch(0, len(groups))
    for g in groups:
        learner.accumulate(g)
    metrics = learner.step()
    assert 0.0 < metrics["logprob_diff_mean"] <= metrics["logprob_diff_max"] < ATOL
    assert metrics["clip_frac"] == 0.0
    # an engine on another convention (raw log_softmax) shows up in the same metrics
    with torch.no_grad():
        raw = response_logprobs(learner.policy, batch_of(groups)).tolist()
    relabelled, i = [], 0
    for g in groups:
        samples = []
        for s in g.samples:
            samples.append(replace(s, logprobs=raw[i : i + len(s.token_ids)]))
            i += len(s.token_ids)
        relabelled.append(replace(g, samples=samples))
    learner.begin_epoch(1, len(groups))
    for g in relabelled:
        learner.accumulate(g)
    assert learner.step()["logprob_diff_max"] > 0.1


def test_missing_engine_logprobs_are_reported_as_unmeasured(setup) -> None:
    cfg, model_dir, groups = setup
    stripped = [replace(g, samples=[replace(s, logprobs=[]) for s in g.samples]) for g in groups]
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    learner.begin_epoch(0, len(stripped))
    for g in stripped:
        learner.accumulate(g)
    metrics = learner.step()
    assert math.isnan(metrics["logprob_diff_max"]) and math.isnan(metrics["logprob_diff_mean"])


# --- greedy is refused for training --------------------------------------------------------------


def test_temperature_zero_is_refused_for_training(setup) -> None:
    with pytest.raises(ConfigError, match=r"temperature 0 \(greedy\) cannot be trained"):
        load_config(None, {"worker.sampling.temperature": 0})
    sim = load_config(None, {"worker.sampling.temperature": 0, "worker.engine": "sim", "trainer.learner": "sim"})
    assert sim.worker.sampling.temperature == 0  # the simulated plane does not sample with it
    cfg, model_dir, _ = setup  # a config built past validation is refused by the learner too
    greedy = cfg.model_copy(
        update={
            "worker": cfg.worker.model_copy(
                update={"sampling": cfg.worker.sampling.model_copy(update={"temperature": 0.0})}
            )
        }
    )
    with pytest.raises(ConfigError, match="greedy"):
        GRPOLearner(learner_settings(greedy), model_dir)


def test_cli_refuses_greedy_training_in_one_line() -> None:
    result = CliRunner().invoke(app, ["up", "--set", "worker.sampling.temperature=0"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "greedy" in errors[0]
