"""Env actors as real OS processes (`prl-actors actor env`): one is SIGKILLed mid-run and one joins;
the learner's EnvClient loses no step silently and `prl-actors replay --check` agrees."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from prl_actors.launch.classic import env_client
from prl_actors.transport.auth import close_context, create_keys, run_key_names
from tests.env_utils import env_config

pytestmark = pytest.mark.integration


def _spawn(config: Path, name: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "prl_actors.cli.main", "actor", "env", "--config", str(config), "--name", name]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _events(run_dir: Path, actor: str) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "logs" / f"{actor}.jsonl").read_text().splitlines() if x.strip()]


def test_killed_env_process_loses_no_step_and_a_joiner_takes_slots(run_dir: Path) -> None:
    cfg = env_config(run_dir, transport="tcp", num_envs=6, wait_actors_s=60.0)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(cfg.dump())
    create_keys(cfg.keys_path(), [*run_key_names(), "env-0", "env-1", "env-2"])  # as `up` does (CurveZMQ on tcp)
    ctx = zmq.Context()
    envs = env_client(cfg, ctx=ctx, log_dir=run_dir / "logs")
    procs = {n: _spawn(run_dir / "config.yaml", n) for n in ("env-0", "env-1")}
    lost = np.zeros(6, dtype=int)
    try:
        envs.reset(seed=0)
        victim = envs.hub.core.slots.owned("env-1")
        rng = np.random.default_rng(0)
        deadline = time.monotonic() + 90
        step, joined_at = 0, None
        while joined_at is None or step < joined_at + 50:
            if step == 40:
                procs["env-1"].send_signal(signal.SIGKILL)
            if step == 80:
                procs["env-2"] = _spawn(run_dir / "config.yaml", "env-2")
            _, _, _, trunc, infos = envs.step(rng.integers(0, 2, size=6))
            if "env_lost" in infos:
                assert trunc[infos["env_lost"]].all()
                lost += infos["env_lost"]
            if joined_at is None and "env-2" in envs.hub.core.slots.owner:
                joined_at = step
            step += 1
            assert time.monotonic() < deadline, "env-2 never took a slot"
    finally:
        envs.close()
        for p in procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        close_context(ctx)
    assert victim and set(np.flatnonzero(lost)) == set(victim) and lost.max() == 1  # each lost once
    assert procs["env-0"].returncode == 0 and procs["env-2"].returncode == 0  # shut down cleanly at the end
    learner = _events(run_dir, "learner")
    assert any(e["event"] == "slot_moved" and e["owner"] == "env-2" for e in learner)  # the joiner took slots
    served = next(e for e in _events(run_dir, "env-2") if e["event"] == "actor_stopped")["counters"]
    assert served.get("slot_steps_served", 0) > 0
    check = subprocess.run(
        [sys.executable, "-m", "prl_actors.cli.main", "replay", str(run_dir), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "check env-steps     ok" in check.stdout and "check env-lost      ok" in check.stdout
    checks = [line.split()[1] for line in check.stdout.splitlines() if line.startswith("check ")]
    assert checks == ["replies", "env-steps", "env-rounds", "env-lost", "aaps"], check.stdout  # only its own
