"""Classic RL through env actors: remote vector env == SyncVectorEnv, a killed env actor loses no step
silently, AAPS threshold 0 fetches every update (real ZeroMQ sockets, actors in this process)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import zmq

from prl_actors.launch.classic import env_client
from prl_actors.replay.checks import env_checks
from prl_actors.replay.events import load_run
from tests.env_utils import EnvActors, env_config

pytestmark = pytest.mark.fast


def _reference(n: int) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])


@pytest.fixture
def remote(run_dir: Path):  # type: ignore[no-untyped-def]
    cfg = env_config(run_dir)
    ctx = zmq.Context()
    envs = env_client(cfg, ctx=ctx, log_dir=run_dir / "logs")
    actors = EnvActors(cfg, ctx, 2)
    yield envs, actors
    envs.close()
    actors.close()
    ctx.destroy(linger=0)


def _assert_env_checks_pass(run_dir: Path) -> None:
    results = env_checks(load_run(run_dir))
    assert results and all(r.ok for r in results), [(r.name, r.violations) for r in results if not r.ok]


def test_remote_vector_env_equals_sync_vector_env(remote, run_dir: Path) -> None:  # type: ignore[no-untyped-def]
    envs, _ = remote
    ref = _reference(5)
    assert envs.single_observation_space == ref.single_observation_space
    assert envs.action_space == ref.action_space and envs.observation_space == ref.observation_space
    obs, ref_obs = envs.reset(seed=7)[0], ref.reset(seed=7)[0]
    assert np.array_equal(obs, ref_obs) and obs.dtype == ref_obs.dtype
    rng = np.random.default_rng(0)
    ended = 0
    for step in range(250):
        actions = rng.integers(0, 2, size=5)
        got, want = envs.step(actions), ref.step(actions)
        for g, w in zip(got[:4], want[:4], strict=True):
            assert g.dtype == w.dtype and np.array_equal(g, w), f"step {step}: {g} != {w}"
        ended += int((want[2] | want[3]).sum())
    assert ended >= 10  # autoresets happened (random CartPole episodes last ~20 steps)
    assert len(set(envs.hub.core.slots.owner)) == 2  # both env actors stepped slots
    envs.close()
    _assert_env_checks_pass(run_dir)


def test_killed_env_actor_loses_no_step(remote, run_dir: Path) -> None:  # type: ignore[no-untyped-def]
    envs, actors = remote
    ref = _reference(5)
    envs.reset(seed=1), ref.reset(seed=1)
    victim = envs.hub.core.slots.owned("env-1")
    rng = np.random.default_rng(1)
    seen_lost = np.zeros(5, dtype=bool)
    for step in range(120):
        if step == 30:
            actors.kill("env-1")
        actions = rng.integers(0, 2, size=5)
        obs, rew, term, trunc, infos = envs.step(actions)
        want = ref.step(actions)
        survivors = [s for s in range(5) if s not in victim]
        assert np.array_equal(obs[survivors], want[0][survivors]), f"step {step}: a surviving slot changed"
        if "env_lost" in infos:
            lost = infos["env_lost"]
            assert trunc[lost].all() and not term[lost].any() and (rew[lost] == 0).all()
            assert not seen_lost[lost].any(), "a slot was reported lost twice"
            seen_lost |= lost
    assert set(np.flatnonzero(seen_lost)) <= set(victim)
    assert envs.live_actors == ["env-0"] and set(envs.hub.core.slots.owner) == {"env-0"}
    envs.close()
    events = [json.loads(line) for line in (run_dir / "logs" / "learner.jsonl").read_text().splitlines()]
    totals = [e for e in events if e["event"] == "env_steps"][-1]
    assert totals["slot_steps"] == 120 * 5 == totals["stepped"] + totals["reset"] + totals["truncated"]
    assert totals["truncated"] == seen_lost.sum() >= 1
    survivor = [json.loads(line) for line in (run_dir / "logs" / "env-0.jsonl").read_text().splitlines()]
    resets = [e for e in survivor if e["event"] == "env_reset"]
    moved = {s for e in resets[1:] for s in e["slots"]}
    assert set(victim) <= moved  # every slot of the killed actor was reset on the survivor
    _assert_env_checks_pass(run_dir)


def _acting_run(run_dir: Path, threshold: float, updates: int = 5) -> list[dict]:
    from prl_actors.classic.envs.detach import train_acting
    from prl_actors.classic.envs.hub import Hub
    from prl_actors.launch.classic import env_section, learner_settings

    ppo = {"num_steps": 8, "total_timesteps": 4 * 8 * updates, "update_epochs": 2, "stop_when_solved": False}
    cfg = env_config(run_dir, mode="acting", num_envs=4, sync_kl_threshold=threshold, ppo=ppo)
    (run_dir).mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfg.dump())
    ctx = zmq.Context()
    hub = Hub(learner_settings(cfg), ctx, run_dir / "logs")
    actors = EnvActors(cfg, ctx, 2)
    rows: list[dict] = []
    try:
        result = train_acting(hub, env_section(cfg), cfg.run.seed, rows.append)
    finally:
        hub.close()
        actors.close()
        ctx.destroy(linger=0)
    assert result["updates"] == updates == len(rows)
    return rows


def test_aaps_threshold_zero_fetches_every_update(run_dir: Path) -> None:
    rows = _acting_run(run_dir, threshold=0.0)
    assert [r["actors"] for r in rows] == [2] * 5
    assert [r["weight_fetches"] for r in rows] == [2] * 5  # round 0: the initial fetch; then one per update each
    assert all(r["staleness_max"] == 0 for r in rows)  # every segment acted with its round's version
    assert all(r["aaps_kl_mean"] is not None and r["aaps_kl_mean"] > 0 for r in rows[1:])
    assert rows[-1]["version"] == 5
    _assert_env_checks_pass(run_dir)


def test_aaps_high_threshold_keeps_acting_with_the_old_policy(run_dir: Path) -> None:
    rows = _acting_run(run_dir, threshold=1e6)
    assert [r["weight_fetches"] for r in rows] == [2, 0, 0, 0, 0]  # only the initial fetch
    assert [r["staleness_max"] for r in rows] == [0, 1, 2, 3, 4]
    assert all(r["aaps_kl_max"] is not None and r["aaps_kl_max"] < 1e6 for r in rows[1:])
    _assert_env_checks_pass(run_dir)
