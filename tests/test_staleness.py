"""Bounded staleness, the parts that exist: the predicate (protocol/versions.py), the replay check and
histogram (replay/staleness.py), the config refusal of run.mode bounded, and the learner's correction
of a stale group (decoupled PPO: proximal = the epoch-start policy, behaviour = the engine's
log-probs, the truncated IS weight between them: trainer.is_correction tis)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from prl_actors.config import load_config
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.launch import build
from prl_actors.launch.topology import learner_settings
from prl_actors.protocol.versions import on_policy, staleness, within_bound
from prl_actors.replay.checks import staleness_check
from prl_actors.replay.events import merge
from prl_actors.replay.staleness import check_staleness, histogram, render, total
from prl_actors.sections import ConfigError
from prl_actors.training.grpo import GRPOLearner
from tests.learning_utils import prompts, random_rewards, tiny_model

TEXTS = ["3+4=", "12+19=", "7+15=", "0+0="]


def test_k_zero_is_on_policy_and_the_bound_counts_versions() -> None:
    for epoch in range(-1, 5):
        for version in range(-2, 7):
            assert within_bound(epoch, version, 0) == on_policy(epoch, version)
    assert staleness(5, 3) == 2 and staleness(2, 3) == -1
    assert within_bound(5, 3, 2) and not within_bound(5, 2, 2)
    assert not within_bound(2, 3, 4)  # newer weights than the epoch's: never
    assert not within_bound(1, -1, 4)  # no weights


def ev(actor: str, event: str, t: float, **fields: object) -> dict:
    return {"actor": actor, "role": actor.split("-")[0], "event": event, "t_mono": t, "t_wall": 1000 + t, **fields}


def trained(t: float, epoch: int, version: int, gid: int) -> dict:
    return ev("trainer", "train_group", t, epoch=epoch, msg_epoch=epoch, msg_version=version, group_id=gid)


def test_replay_histogram_and_bound(tmp_path: Path) -> None:
    run = merge([trained(0.1, 0, 0, 0), trained(0.2, 0, 0, 1), trained(0.3, 1, 1, 0), trained(0.4, 1, 0, 1)], tmp_path)
    assert histogram(run) == {0: {0: 2}, 1: {0: 1, 1: 1}}
    assert render(total(histogram(run))) == "j=0: 3, j=1: 1"
    assert check_staleness(run, 1) == []
    bad = check_staleness(run, 0)
    assert len(bad) == 1 and "group 1 of epoch 1" in bad[0].message and "staleness 1, bound 0" in bad[0].message
    result = staleness_check(run)  # no config.yaml: k = 0 (strict on-policy)
    assert not result.ok and "j=0: 3, j=1: 1" in result.summary


def test_bounded_mode_config() -> None:
    """Stale samples need a correction; what is not pipelined yet is refused with one line."""
    ok = load_config(None, {"run.mode": "bounded", "run.max_staleness": 2, "trainer.is_correction": "tis"})
    assert ok.run.staleness_bound() == 2
    assert (
        load_config(None, {"run.mode": "bounded"}).run.staleness_bound() == 0
    )  # k = 0: periodic, no correction needed
    assert load_config(None, {"run.mode": "periodic"}).run.staleness_bound() == 0
    assert load_config(None, {"run.mode": "bounded", "run.max_staleness": 1}).trainer.is_correction == "tis"  # default
    for overrides, needle in [
        ({"run.max_staleness": 1, "trainer.is_correction": "none"}, "trainer.is_correction tis"),
        ({"run.max_staleness": 1, "trainer.is_correction": "tis", "coordinator.dynamic_sampling": True}, "dynamic"),
    ]:
        with pytest.raises(ConfigError, match=needle) as info:
            load_config(None, {"run.mode": "bounded", **overrides})
        assert "\n" not in str(info.value).strip()
    with pytest.raises(ConfigError, match="applies to run.mode bounded"):
        load_config(None, {"run.max_staleness": 2})


@pytest.fixture(scope="module")
def stale(tmp_path_factory: pytest.TempPathFactory):
    """Groups generated with v0 and the learner that made v1 from them (epoch 0 trained)."""
    cfg, model_dir = tiny_model(tmp_path_factory.mktemp("stale"), trainer__lr=3e-2)
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    groups = random_rewards(engine.generate(prompts(TEXTS), 4))
    return cfg, model_dir, groups


def learner_at_v1(cfg, model_dir, groups, **trainer) -> GRPOLearner:
    learner = GRPOLearner(
        learner_settings(cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update=trainer)})), model_dir
    )
    learner.begin_epoch(0, len(groups))
    for g in groups:
        learner.accumulate(g)
    learner.step()
    return learner


def test_a_stale_group_is_corrected_towards_the_proximal_policy(stale) -> None:
    """Epoch 1 trains v0's groups (staleness 1) at v1: the IS ratio pi_v1 / mu_v0 departs from 1 and
    is reported; tis changes the update against none; periodic arrival == sync with M = 2, mu = 2."""
    cfg, model_dir, groups = stale
    opts = {"is_correction": "tis", "is_cap": 1.2, "num_minibatches": 2, "num_iterations": 2}
    sync = learner_at_v1(cfg, model_dir, groups, **opts)
    sync.begin_epoch(1, len(groups))
    for g in groups:
        sync.accumulate(g)
    m = sync.step()
    assert m["is_ratio_max"] > 1.2 and m["is_ratio_min"] < 0.95 and 0 < m["is_corrected_frac"] < 1
    periodic = learner_at_v1(cfg, model_dir, groups, **opts)
    rng = random.Random(1)
    order = groups[:]
    rng.shuffle(order)
    periodic.begin_epoch(1, len(groups))
    for g in order:
        periodic.accumulate(g)
        periodic.flush(1)
    periodic.step()
    plain = learner_at_v1(cfg, model_dir, groups, **{**opts, "is_correction": "none"})
    plain.begin_epoch(1, len(groups))
    for g in groups:
        plain.accumulate(g)
    plain.step()
    sw, pw, nw = (x.policy.state_dict() for x in (sync, periodic, plain))
    assert max((sw[k] - pw[k]).abs().max().item() for k in sw) < 1e-4
    assert max((sw[k] - nw[k]).abs().max().item() for k in sw) > 1e-3


def test_a_fresh_group_has_ratio_one(stale) -> None:
    """The same groups at v0 (staleness 0): the ratio is 1 to float32 rounding; nothing capped."""
    cfg, model_dir, groups = stale
    learner = GRPOLearner(
        learner_settings(cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"is_correction": "tis"})})),
        model_dir,
    )
    learner.begin_epoch(0, len(groups))
    for g in groups:
        learner.accumulate(g)
    m = learner.step()
    assert abs(m["is_ratio_max"] - 1) < 1e-3 and abs(m["is_ratio_min"] - 1) < 1e-3 and m["is_corrected_frac"] == 0
    assert torch.isfinite(torch.tensor(m["is_ratio_mean"]))
