"""Bounded mode's pull policy (weights/pulls.py): when a worker pays for a weight load.

- the arithmetic of the drift estimate and the pull rule;
- the coordinator announces the newest published version and the steps' KLs (bounded k >= 1 only);
- a worker core holding weights within the floor keeps generating with them (no fetch), fetches when
  the floor passes it, and with worker.sync_kl_threshold pulls early: it asks for no more work, lets
  its running groups finish with the weights they started with, then fetches;
- config: the threshold is refused outside bounded mode with k >= 1;
- the five actors (inproc transport, tiny model): with k = 2 a worker skips versions, the buffer never
  refuses a group for staleness, every group is trained exactly once within the bound and
  `replay --check` passes; a small threshold pulls on the trainer's announced drift; with threshold 0
  the worker loads every version as at k = 0 (at most one less: a version the trainer published while
  the fetch of the one before was under way, since the publisher serves its newest).
- the trainer's probe: the step's KL matches a recomputation, and a probe that cannot be scored
  leaves the step alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prl_actors.config import Config, load_config
from prl_actors.engines.sim import SimEngine
from prl_actors.launch import build
from prl_actors.protocol import messages as m
from prl_actors.replay import load_run
from prl_actors.replay.checks import run_checks
from prl_actors.replay.coordinator_replay import CaptureLog
from prl_actors.replay.staleness import histogram
from prl_actors.sections import ConfigError
from prl_actors.weights.pulls import announced, drift_estimate, should_pull, to_wire
from prl_actors.weights.transfer import Snapshot, transfer_messages
from tests.conftest import read_logs
from tests.test_bounded_actors import run as run_cluster
from tests.test_epoch_protocol import coordinator, drive, inbound, m_inbound, open_epoch, sim_config_for_cores, worker

# --- the rule -------------------------------------------------------------------------------------


def test_drift_estimate_sums_square_roots_of_the_steps_not_loaded() -> None:
    kls = {3: 0.01, 4: 0.04, 5: 0.09}
    assert drift_estimate(4, 4, kls) == 0.0
    assert drift_estimate(5, 6, kls) == pytest.approx(0.09)
    assert drift_estimate(3, 6, kls) == pytest.approx((0.1 + 0.2 + 0.3) ** 2)  # >= the plain sum 0.14
    assert drift_estimate(2, 6, kls) is None  # step 2 -> 3 unknown
    assert drift_estimate(-1, 6, kls) is None
    assert drift_estimate(3, 5, {3: 0.01, 4: -1.0}) is None


def test_should_pull_threshold_none_zero_and_positive() -> None:
    assert not should_pull(None, 10.0, 1, 3)  # off: the floor rule alone
    assert should_pull(0.0, None, 1, 2)  # 0: every newer version, whatever the estimate
    assert not should_pull(0.0, None, 2, 2)  # nothing newer
    assert should_pull(0.01, 0.02, 1, 2) and not should_pull(0.01, 0.01, 1, 2)
    assert not should_pull(0.01, None, 1, 2)  # unknown: no early pull


def test_wire_form_round_trips() -> None:
    kls = {1: 0.5, 3: 0.25}
    wire = to_wire(4, 1, kls)
    assert wire == [0.5, -1.0, 0.25]
    assert announced(4, wire) == kls
    assert to_wire(2, 2, kls) == [] and announced(2, []) == {}


# --- the coordinator announces ------------------------------------------------------------------


def bounded_coordinator(k: int, epochs: int = 6):  # type: ignore[no-untyped-def]
    core = coordinator(epochs)
    core.s = dataclasses.replace(core.s, mode="bounded" if k else "periodic", max_staleness=k)
    return core


def heartbeat_ack(core: Any, now: float) -> m.HeartbeatAck:
    (_, ack), *_ = drive(core, now, m.Heartbeat(version=0), "worker-a")
    assert isinstance(ack, m.HeartbeatAck)
    return ack


def test_coordinator_announces_newest_and_step_kls_in_bounded_mode_only() -> None:
    core = bounded_coordinator(2)
    open_epoch(core)
    ack = heartbeat_ack(core, 0.1)
    assert (ack.version, ack.newest, ack.step_kls) == (0, 0, [])
    drive(core, 0.2, m.WeightsAvailable(version=1), "publisher")
    ack = heartbeat_ack(core, 0.3)
    assert (ack.newest, ack.step_kls) == (1, [-1.0])  # v1 published, its step's KL not heard yet
    drive(core, 0.4, m.StepDone(epoch=0, version=1, metrics={"step_kl": 0.125}), "trainer")
    assert heartbeat_ack(core, 0.5).step_kls == [0.125]
    periodic = bounded_coordinator(0)
    open_epoch(periodic)
    drive(periodic, 0.4, m.StepDone(epoch=0, version=1, metrics={"step_kl": 0.125}), "trainer")
    ack = heartbeat_ack(periodic, 0.5)
    assert (ack.newest, ack.step_kls) == (-1, [])  # periodic: the messages are as before


def test_a_resumed_run_announces_at_most_k_plus_one_steps() -> None:
    core = bounded_coordinator(2, epochs=50)
    drive(core, 0.0, m.Register(role=m.Role.WORKER), "worker-a")
    drive(core, 0.1, m.WeightsAvailable(version=30), "publisher")  # resumed at v30, no epoch open yet
    ack = heartbeat_ack(core, 0.2)
    assert ack.newest == 30 and ack.step_kls == [-1.0] * 3


# --- the worker's pulls ------------------------------------------------------------------------


def loaded_worker(threshold: float | None, k: int = 2):  # type: ignore[no-untyped-def]
    engine = SimEngine(build.engine_settings(sim_config_for_cores()))
    engine.load_weights(1, {"theta": np.zeros((8, 8), dtype=np.float32)})
    core = worker(engine)
    core.max_staleness, core.sync_kl_threshold = k, threshold
    core.log = CaptureLog("worker-x")  # the events in memory
    core.now = 0.0
    return core, engine


def tell(core: Any, msg: m.Msg) -> list[m.Msg]:
    core.handle(core.now, inbound(msg, "coordinator", peer="coordinator"))
    out, core.outbox = core.outbox, []
    return [x for _, x, _ in out]


def generate_assigned(core: Any) -> list[m.Msg]:
    while core.deferred:  # what the host does: generation runs as later inbox items
        core.deferred.pop(0)(core.now)
    out, core.outbox = core.outbox, []
    return [x for _, x, _ in out]


def serve(core: Any, version: int) -> None:
    snap = Snapshot.from_tensors(version, {"theta": np.full((8, 8), version, dtype=np.float32)})
    for part, payloads in transfer_messages(snap, 1 << 20, epoch=version):
        core.handle(core.now, m_inbound(part, payloads))


def tags(out: list[m.Msg]) -> list[str]:
    return [m.tag_of(x) for x in out]


def test_worker_within_the_floor_keeps_its_weights_and_fetches_when_the_floor_passes() -> None:
    core, engine = loaded_worker(None)
    out = tell(core, m.EpochStart(epoch=3, version=1, groups=4, newest=3, step_kls=[0.5, 0.5]))
    assert "fetch_weights" not in tags(out) and "work_request" in tags(out)  # v1 is the floor of epoch 3
    tell(core, m.NoWork(reply_to="r", reason=m.NoWorkReason.QUEUE_EMPTY))
    out = tell(core, m.EpochStart(epoch=4, version=2, groups=4, newest=3, step_kls=[0.5]))
    assert "fetch_weights" in tags(out)  # the floor passed v1
    serve(core, 3)  # the publisher's newest
    assert engine.version == 3 and core.counters["weight_loads"] == 1 and core.counters["versions_skipped"] == 1
    (pulled,) = [e for e in core.log.events if e["event"] == "weights_pulled"]
    assert (pulled["reason"], pulled["held"], pulled["skipped"]) == ("floor", 1, 1)


def test_worker_pulls_early_on_drift_after_its_running_groups_finish() -> None:
    core, engine = loaded_worker(0.1)
    out = tell(core, m.EpochStart(epoch=3, version=1, groups=4, newest=2, step_kls=[0.04]))
    assert "fetch_weights" not in tags(out)  # 0.04 <= 0.1: keep v1
    assign = m.WorkAssign(reply_to="r", epoch=3, version=1, prompts=[m.Prompt(group_id=2, prompt="ctx 1", answer="4")])
    tell(core, assign)
    assert engine.busy
    out = tell(core, m.HeartbeatAck(reply_to="h", epoch=3, version=1, newest=3, step_kls=[0.04, 0.05]))
    assert core.pull_due and "fetch_weights" not in tags(out)  # (0.2 + 0.22)^2 > 0.1, but group 2 runs
    more = m.WorkAssign(reply_to="r2", epoch=3, version=1, prompts=[m.Prompt(group_id=3, prompt="ctx 1", answer="4")])
    out = tell(core, more)  # the answer to the request that was out: taken (v1 is within the bound) ...
    assert "work_request" not in tags(out) and "fetch_weights" not in tags(out)  # ... but no more asked
    out = generate_assigned(core)
    sent = [x for x in out if isinstance(x, m.GroupResult)]
    assert sorted((g.group.group_id, g.version, g.epoch) for g in sent) == [(2, 1, 3), (3, 1, 3)]  # with v1
    assert "fetch_weights" in tags(out) and "work_request" not in tags(out)  # idle now: fetch, ask nothing
    serve(core, 3)
    assert engine.version == 3 and not core.pull_due
    pulled = [e for e in core.log.events if e["event"] == "weights_pulled"]
    assert [(e["reason"], e["skipped"]) for e in pulled] == [("drift", 1)]
    assert core.counters.get("groups_dropped", 0) == 0


def test_worker_with_threshold_zero_pulls_every_newer_version_at_once() -> None:
    core, engine = loaded_worker(0.0)
    out = tell(core, m.HeartbeatAck(reply_to="h", epoch=2, version=0, newest=2, step_kls=[-1.0, -1.0]))
    assert "fetch_weights" in tags(out)  # unknown KLs: threshold 0 pulls anyway
    serve(core, 2)
    out = tell(core, m.HeartbeatAck(reply_to="h", epoch=2, version=0, newest=2, step_kls=[-1.0, -1.0]))
    assert engine.version == 2 and "fetch_weights" not in tags(out)  # nothing newer


# --- the trainer's drift probe -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path]:
    from tests.learning_utils import tiny_model

    return tiny_model(tmp_path_factory.mktemp("tiny"), trainer__lr=0.05)


def groups_for(n: int, vocab: int = 12) -> list[m.Group]:
    """n groups of 4 samples with mixed 0/1 rewards (non-zero advantages) over tokens 3 .. vocab-1."""
    out = []
    for gid in range(n):
        samples = [
            m.Sample(text="x", token_ids=[3 + (gid + j + t) % (vocab - 3) for t in range(4)], logprobs=[], reward=j % 2)
            for j in range(4)
        ]
        out.append(m.Group(group_id=gid, prompt="1+1=", prompt_ids=[4, 5, 6], samples=samples, worker="worker-0"))
    return out


def trainer_core(cfg: Config, model_dir: Path) -> Any:
    from prl_actors.launch.topology import learner_settings
    from prl_actors.records.logs import EventLog
    from prl_actors.records.rundir import MemorySink
    from prl_actors.trainer.core import TrainerCore
    from prl_actors.training.grpo import GRPOLearner

    learner = GRPOLearner(learner_settings(cfg), model_dir)
    core = TrainerCore("trainer", EventLog("trainer", "trainer"), learner, MemorySink(), 8, 1 << 20, 5.0)
    core.drift_probe, core.max_staleness = True, 2
    core.log = CaptureLog("trainer")
    return core


def train_epoch(core: Any, groups: list[m.Group], spoil_probe: bool = False) -> dict[str, float]:
    core.handle(0.0, inbound(m.EpochOpen(epoch=0, version=0, groups=len(groups)), "buffer", peer="buffer"))
    for seq, g in enumerate(groups):
        core.handle(0.0, inbound(m.TrainGroup(epoch=0, version=0, seq=seq, group=g), "buffer", peer="buffer"))
    if spoil_probe:  # a probe the model cannot score (a token outside the vocabulary)
        bad = m.Sample(text="x", token_ids=[10**6], logprobs=[], reward=1.0)
        core.probe = [m.Group(group_id=0, prompt="x", prompt_ids=[4], samples=[bad], worker="worker-0")]
    core.handle(0.0, inbound(m.EpochComplete(epoch=0, groups=len(groups)), "buffer", peer="buffer"))
    assert core.learner.version == 1  # the step happened either way
    ((_, metrics),) = core.finished.values()
    return metrics  # type: ignore[no-any-return]


def test_trainer_reports_the_steps_kl_on_a_probe(tiny: tuple[Config, Path]) -> None:
    from prl_actors.training.drift import PROBE_GROUPS, probe_logprobs, step_kl

    cfg, model_dir = tiny
    core = trainer_core(cfg, model_dir)
    groups = groups_for(4)
    before = probe_logprobs(core.learner, groups[:PROBE_GROUPS])
    assert before is not None and before.numel() == PROBE_GROUPS * 4 * 4
    assert step_kl(before, before) == 0.0
    metrics = train_epoch(core, groups)
    after = probe_logprobs(core.learner, groups[:PROBE_GROUPS])
    assert after is not None
    assert metrics["step_kl"] > 0.0 and metrics["step_kl"] == pytest.approx(step_kl(before, after), abs=1e-8)


def test_a_probe_that_fails_leaves_the_step_alone(tiny: tuple[Config, Path]) -> None:
    cfg, model_dir = tiny
    metrics = train_epoch(core := trainer_core(cfg, model_dir), groups_for(4), spoil_probe=True)
    assert metrics["step_kl"] == -1.0 and core.counters["drift_probe_failed"] == 1


# --- config -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "k", "why"),
    [("periodic", 0, "run.mode periodic"), ("sync", 0, "run.mode sync"), ("bounded", 0, "run.max_staleness 0")],
)
def test_threshold_is_refused_where_every_version_is_loaded(mode: str, k: int, why: str) -> None:
    sets: dict[str, Any] = {"run.mode": mode, "run.max_staleness": k, "worker.sync_kl_threshold": 0.01}
    sets["trainer.is_correction"] = "tis"
    with pytest.raises(ConfigError) as exc:
        load_config(None, sets)
    line = str(exc.value)
    assert "\n" not in line and "worker.sync_kl_threshold applies to run.mode bounded" in line and why in line
    sets.update({"run.mode": "bounded", "run.max_staleness": 2})
    assert load_config(None, sets).worker.sync_kl_threshold == 0.01
    with pytest.raises(ConfigError, match="sync_kl_threshold"):
        load_config(None, {**sets, "worker.sync_kl_threshold": -1.0})


# --- the five actors -----------------------------------------------------------------------------

GROUPS = 8
EPOCHS = 6
# generation-bound (long hot samples, 8 groups per epoch): the trainer publishes v_{e+1} while epoch e+1
# is generated, so the newest version is ahead of the floor when a worker must load
GEN_BOUND = {"worker.sampling.max_new_tokens": 32, "worker.sampling.temperature": 2.0}


def config(run_dir: Path, model: Path | None, k: int, threshold: float | None = None) -> Config:
    return load_config(
        None,
        {
            "run.run_dir": str(run_dir),
            "run.epochs": EPOCHS,
            "run.mode": "bounded",
            "run.max_staleness": k,
            "transport.kind": "inproc",
            "coordinator.groups_per_epoch": GROUPS,
            "coordinator.heartbeat_interval_s": 0.05,
            "worker.group_size": 4,
            "worker.sync_kl_threshold": threshold,
            "model.warm_start_steps": 300,
            "model.path": str(model) if model else None,
            "trainer.is_correction": "tis",
            **GEN_BOUND,
        },
    )


def run(cfg: Config, workers: int = 1) -> Path:
    return run_cluster(cfg, workers)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from prl_actors.launch import build

    root = tmp_path_factory.mktemp("model")
    return build.model_dir(config(root, None, 2), root)


def pulls_of(events: list[dict[str, Any]], before: int = EPOCHS) -> list[dict[str, Any]]:
    """The worker's loads of versions v0 .. v_{before-1} (v_E may be pulled before the run's end)."""
    return [e for e in events if e["event"] == "weights_pulled" and e["new_version"] < before]


def invariants(run_dir: Path, k: int) -> list[dict[str, Any]]:
    """Exactly once, one step per epoch, no group refused, nothing trained beyond k, replay green."""
    events = read_logs(run_dir)
    keys = sorted((e["msg_epoch"], e["group_id"]) for e in events if e["event"] == "train_group")
    assert keys == [(ep, g) for ep in range(EPOCHS) for g in range(GROUPS)]
    refused = [e for e in events if e["event"] in ("group_rejected", "train_rejected")]
    assert refused == [], refused  # the buffer (and trainer) never saw a group older than k
    loaded = load_run(run_dir)
    hist = histogram(loaded)
    assert all(set(h) <= set(range(k + 1)) for h in hist.values()), hist
    checks = {c.name: c for c in run_checks(loaded)}
    assert all(c.ok for c in checks.values()), {n: (c.summary, c.violations) for n, c in checks.items()}
    return events


def step_kls(run_dir: Path) -> list[float]:
    rows = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines() if r.strip()]
    assert [r["epoch"] for r in rows] == list(range(EPOCHS))
    return [r["step_kl"] for r in rows]


@pytest.mark.integration
def test_k2_worker_skips_versions_and_nothing_is_refused(tmp_path: Path, model_dir: Path) -> None:
    run_dir = run(config(tmp_path / "k2", model_dir, k=2))
    pulls = pulls_of(invariants(run_dir, k=2))
    assert all(p["reason"] == "floor" for p in pulls)
    assert sum(p["skipped"] for p in pulls) >= 1, pulls  # a published version was never loaded
    assert len(pulls) < EPOCHS, pulls  # fewer loads than k = 0 (v0 .. v_{E-1}, one per epoch)
    assert "step_kl" not in (run_dir / "metrics.jsonl").read_text()  # no threshold: no probe


@pytest.mark.integration
def test_a_small_threshold_pulls_on_the_trainers_drift(tmp_path: Path, model_dir: Path) -> None:
    run_dir = run(config(tmp_path / "drift", model_dir, k=2, threshold=1e-6))
    events = invariants(run_dir, k=2)
    kls = step_kls(run_dir)
    assert all(kl >= 0.0 and math.isfinite(kl) for kl in kls) and max(kls) > 1e-6, kls
    due = [e for e in events if e["event"] == "pull_due"]
    assert due and all(e["drift_kl"] > 1e-6 for e in due), due
    assert any(p["reason"] == "drift" for p in pulls_of(events)), pulls_of(events)


@pytest.mark.integration
def test_threshold_zero_loads_every_version_like_k0(tmp_path: Path, model_dir: Path) -> None:
    lazy = pulls_of(invariants(run(config(tmp_path / "lazy", model_dir, k=2)), k=2))
    eager = pulls_of(invariants(run(config(tmp_path / "eager", model_dir, k=2, threshold=0.0)), k=2))
    k0 = pulls_of(invariants(run(config(tmp_path / "k0", model_dir, k=0)), k=0))
    assert [p["new_version"] for p in k0] == list(range(EPOCHS))  # k = 0: every version, once
    versions = [p["new_version"] for p in eager]
    assert versions == sorted(set(versions)) and len(versions) > len(lazy), (eager, lazy)
    # every version but, at most, one the trainer published while the worker's fetch of the one before
    # was under way (the publisher serves its newest)
    assert len(versions) >= EPOCHS - 1, eager
