"""trainer.is_correction (tis / mis): the engine-mismatch importance weight on the real learner.

The torch engine's log-probs equal the trainer's up to float32 rounding on CPU (rho ~ 1), so these
tests doctor the groups: each sample's engine log-probs are shifted on purpose, which sets
rho = exp(old - engine) to a known value, and the gradient must change exactly as the formula says.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from msgspec.structs import replace

from prl_actors.config import Config, load_config
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.launch import build
from prl_actors.launch.topology import learner_settings
from prl_actors.protocol.messages import Group
from prl_actors.sections import ConfigError
from prl_actors.training.grpo import GRPOLearner
from prl_actors.training.losses import engine_is_weights
from tests.learning_utils import prompts, random_rewards, tiny_model

TEXTS = ["3+4=", "12+19=", "7+15=", "0+0="]


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path, list[Group]]:
    cfg, model_dir = tiny_model(
        tmp_path_factory.mktemp("is"), trainer__lr=1e-2, coordinator__groups_per_epoch=len(TEXTS)
    )
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    return cfg, model_dir, random_rewards(engine.generate(prompts(TEXTS), 4))


def learner_for(cfg: Config, model_dir: Path, **trainer: object) -> GRPOLearner:
    return GRPOLearner(
        learner_settings(cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update=trainer)})), model_dir
    )


def shifted(groups: list[Group], shift: float, only: set[tuple[int, int]] | None = None) -> list[Group]:
    """The groups with engine log-probs lowered by `shift` (rho = exp(shift)) on every sample, or on
    the samples (group index, sample index) in `only`."""
    return [
        replace(
            g,
            samples=[
                replace(s, logprobs=[lp - shift for lp in s.logprobs]) if only is None or (gi, si) in only else s
                for si, s in enumerate(g.samples)
            ],
        )
        for gi, g in enumerate(groups)
    ]


def grads_of(learner: GRPOLearner, groups: list[Group]) -> dict[str, torch.Tensor]:
    """The summed (not yet normalised) gradient of one epoch's groups, nothing stepped."""
    learner.begin_epoch(0, len(groups))
    for g in groups:
        learner.accumulate(g)
    learner.flush()
    return {n: p.grad.detach().clone() for n, p in learner.policy.named_parameters() if p.grad is not None}


def close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], scale: float = 1.0) -> bool:
    """a == scale x b per tensor, to 1e-4 of the tensor's largest entry (rho ~ 1 +- 1e-6 unperturbed,
    and entries that are sums of cancelling terms keep that error in absolute terms)."""
    return a.keys() == b.keys() and all(
        float((a[k] - scale * b[k]).abs().max()) <= 1e-4 * max(float(b[k].abs().max()), 1e-12) for k in a
    )


def test_weights_by_hand() -> None:
    old = torch.log(torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=torch.float64))
    engine = torch.log(torch.tensor([0.5, 0.25, 0.1, float("nan")], dtype=torch.float64))  # rho 1, 2, 5, ?
    w, rho, over = engine_is_weights(old, engine, "tis", 3.0)
    assert torch.allclose(w, torch.tensor([1.0, 2.0, 3.0, 1.0], dtype=torch.float64))
    assert torch.allclose(rho[:3], torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64)) and rho[3].isnan()
    assert over.tolist() == [False, False, True, False]
    w, _, over = engine_is_weights(old, engine, "mis", 3.0)
    assert torch.allclose(w, torch.tensor([1.0, 2.0, 0.0, 1.0], dtype=torch.float64))
    assert over.tolist() == [False, False, True, False]
    w, _, over = engine_is_weights(old, engine, "none", 3.0)
    assert torch.equal(w, torch.ones(4, dtype=torch.float64)) and not over.any()


def test_unperturbed_ratio_is_one_and_metrics_report_it(rollouts) -> None:
    """float32 on CPU: the engine's log-probs are the trainer's, rho = 1 up to rounding; tis with
    rho ~ 1 trains as none does."""
    cfg, model_dir, groups = rollouts
    learner = learner_for(cfg, model_dir, is_correction="tis")
    learner.begin_epoch(0, len(groups))
    for g in groups:
        learner.accumulate(g)
    m = learner.step()
    assert abs(m["is_ratio_mean"] - 1) < 1e-4 and m["is_ratio_min"] > 0.999 and m["is_ratio_max"] < 1.001
    assert m["is_corrected_frac"] == 0
    assert close(
        grads_of(learner_for(cfg, model_dir, is_correction="tis"), groups),
        grads_of(learner_for(cfg, model_dir), groups),
    )


@pytest.mark.parametrize(
    ("mode", "shift", "cap", "factor"),
    [
        ("tis", math.log(1.5), 2.0, 1.5),  # under the cap: the gradient scales by rho
        ("tis", math.log(4.0), 2.0, 2.0),  # over it: by the cap
        ("mis", math.log(1.5), 2.0, 1.5),  # mis under the cap: by rho
        ("mis", math.log(4.0), 2.0, 0.0),  # mis over it: the tokens leave the loss
        ("tis", math.log(0.5), 2.0, 0.5),  # an engine more confident than the trainer: rho < 1
        ("none", math.log(4.0), 2.0, 1.0),  # off: the engine's log-probs do not enter the loss
    ],
)
def test_a_uniform_shift_scales_the_gradient(rollouts, mode: str, shift: float, cap: float, factor: float) -> None:
    """beta = 0, no entropy: the loss is the policy-gradient term alone, so w_t = const scales it."""
    cfg, model_dir, groups = rollouts
    base = grads_of(learner_for(cfg, model_dir), groups)
    assert any(g.abs().max() > 0 for g in base.values())
    got = grads_of(learner_for(cfg, model_dir, is_correction=mode, is_cap=cap), shifted(groups, shift))
    assert close(got, base, factor)


def test_per_sample_shift_is_linear(rollouts) -> None:
    """Shift two samples only (rho = 3, capped at 2): gradient = none's + (2 - 1) x the gradient of
    those two samples alone (the others masked with mask_truncated_completions)."""
    cfg, model_dir, groups = rollouts
    chosen = {(0, 1), (2, 3)}
    base = grads_of(learner_for(cfg, model_dir), groups)
    alone = [
        replace(g, samples=[s if (gi, si) in chosen else replace(s, finished=False) for si, s in enumerate(g.samples)])
        for gi, g in enumerate(groups)
    ]
    part = grads_of(learner_for(cfg, model_dir, mask_truncated_completions=True), [replace(g) for g in alone])
    got = grads_of(learner_for(cfg, model_dir, is_correction="tis", is_cap=2.0), shifted(groups, math.log(3.0), chosen))
    expected = {k: base[k] + part[k] for k in base}
    assert close(got, expected)
    assert not close(got, base)


def test_metrics_count_the_capped_tokens(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    chosen = {(0, 0), (1, 2)}
    doctored = shifted(groups, math.log(3.0), chosen)
    learner = learner_for(cfg, model_dir, is_correction="mis", is_cap=2.0)
    learner.begin_epoch(0, len(doctored))
    for g in doctored:
        learner.accumulate(g)
    m = learner.step()
    total = sum(len(s.token_ids) for g in groups for s in g.samples)
    capped = sum(len(groups[gi].samples[si].token_ids) for gi, si in chosen)
    assert m["is_corrected_frac"] == pytest.approx(capped / total)
    assert m["is_ratio_max"] == pytest.approx(3.0, rel=1e-3) and m["is_ratio_min"] == pytest.approx(1.0, abs=1e-3)


def test_periodic_equals_sync_with_tis(rollouts) -> None:
    """Per-token, order-independent weights: shuffled arrival with idle flushes ends at the sync
    weights, with M = 2, mu = 2 (the frozen old policy) and rho spread across the cap."""
    cfg, model_dir, groups = rollouts
    rng = random.Random(0)
    doctored = [
        replace(g, samples=[replace(s, logprobs=[lp - rng.uniform(-1.5, 1.5) for lp in s.logprobs]) for s in g.samples])
        for g in groups
    ]
    opts = {"is_correction": "tis", "is_cap": 2.0, "num_minibatches": 2, "num_iterations": 2, "beta": 0.05}
    sync, periodic = learner_for(cfg, model_dir, **opts), learner_for(cfg, model_dir, **opts)
    sync.begin_epoch(0, len(doctored))
    for g in doctored:
        sync.accumulate(g)
    m = sync.step()
    assert 0 < m["is_corrected_frac"] < 1
    order = doctored[:]
    rng.shuffle(order)
    periodic.begin_epoch(0, len(doctored))
    for g in order:
        periodic.accumulate(g)
        if rng.random() < 0.5:
            periodic.flush(rng.choice([None, 1]))
    periodic.step()
    sw, pw = sync.policy.state_dict(), periodic.policy.state_dict()
    assert max((sw[k] - pw[k]).abs().max().item() for k in sw) < 1e-4
    plain = learner_for(cfg, model_dir, **{**opts, "is_correction": "none"})
    plain.begin_epoch(0, len(doctored))
    for g in doctored:
        plain.accumulate(g)
    plain.step()
    nw = plain.policy.state_dict()
    assert max((sw[k] - nw[k]).abs().max().item() for k in sw) > 1e-3  # the correction changed the update


def test_cap_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="is_cap"):
        load_config(None, {"trainer.is_cap": 0.5})
    with pytest.raises(ConfigError, match="is_correction"):
        load_config(None, {"trainer.is_correction": "xis"})
