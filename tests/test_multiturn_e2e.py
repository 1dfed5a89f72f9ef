"""Multi-turn runs through the five actors: periodic == sync (same final weights), and `replay --check`
green after a worker is killed mid-episode (its groups are regenerated whole, with the same version)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from prl_actors.config import Config, load_config
from prl_actors.launch.process import LocalCluster
from tests.conftest import assert_invariants, port_base, read_logs, wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "prl_actors.cli.main"]


def guess_config(run_dir: Path, mode: str, model: Path | None, **extra: object) -> Config:
    return load_config(
        ROOT / "configs/guess.yaml",
        {
            "run.run_dir": str(run_dir),
            "run.epochs": 2,
            "run.mode": mode,
            "run.name": f"guess-{mode}",
            "transport.kind": "inproc",
            "coordinator.groups_per_epoch": 4,
            "worker.group_size": 4,
            "model.warm_start_steps": 300,
            "task.max_turns": 4,
            "model.path": str(model) if model else None,
            **extra,
        },
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from prl_actors.launch import build

    root = tmp_path_factory.mktemp("model")
    return build.model_dir(guess_config(root, "sync", None), root)


def run(run_dir: Path, mode: str, model: Path, workers: int) -> None:
    cluster = LocalCluster(guess_config(run_dir, mode, model), workers=workers, log_dir=run_dir / "logs")
    try:
        assert cluster.wait(180), "the multi-turn run did not finish"
    finally:
        cluster.close()


def test_multi_turn_periodic_equals_sync(tmp_path: Path, model_dir: Path) -> None:
    """Episodes streamed to the trainer as they finish (3 workers) give the weights of the synchronous
    run (1 worker), and the runs really were multi-turn (environment tokens in the trained samples)."""
    run(tmp_path / "periodic", "periodic", model_dir, workers=3)
    run(tmp_path / "sync", "sync", model_dir, workers=1)
    for mode in ("periodic", "sync"):
        assert_invariants(tmp_path / mode, epochs=2, groups=4)
    a = load_file(str(tmp_path / "periodic/checkpoints/v2/model/model.safetensors"))
    b = load_file(str(tmp_path / "sync/checkpoints/v2/model/model.safetensors"))
    init = load_file(str(model_dir / "model.safetensors"))
    assert max((b[k] - init[k]).abs().max().item() for k in b) > 1e-4  # it trained ...
    for k in a:  # ... and the same way
        torch.testing.assert_close(a[k], b[k], atol=2e-5, rtol=1e-4, msg=k)
    rows = [json.loads(line) for line in (tmp_path / "periodic/metrics.jsonl").read_text().splitlines()]
    for r in rows:  # model tokens only are trained, and their log-probs agree with the engine's
        assert r["logprob_diff_max"] < 1e-4
        assert r["response_len"] > 2.0  # more than one guess + <eos> per episode on average: several turns


@pytest.mark.slow
def test_replay_check_is_green_after_a_worker_dies_mid_episode(tmp_path: Path, model_dir: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = guess_config(
        run_dir,
        "periodic",
        model_dir,
        **{
            "transport.kind": "tcp",
            "transport.base_port": port_base(),
            "run.workers": 3,
            "run.epochs": 3,
            "coordinator.groups_per_epoch": 6,
            "coordinator.heartbeat_interval_s": 0.2,
            "coordinator.heartbeat_timeout_s": 2.0,
            "task.name": "jsonl",
            "task.prompts_file": str(write_rows(tmp_path)),
            "task.environment": "tests.multiturn_envs:SlowGuess",
        },
    )
    config = tmp_path / "cfg.yaml"
    config.write_text(cfg.dump())
    up = subprocess.Popen(
        [*CLI, "up", "--config", str(config)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        victim = wait_for(run_dir, lambda e: e["event"] == "assign" and e["epoch"] == 1, timeout=120)["worker"]
        pid = wait_for(run_dir, lambda e: e["event"] == "actor_start" and e["actor"] == victim)["pid"]
        os.kill(pid, signal.SIGKILL)
        _, err = up.communicate(timeout=240)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, err[-3000:]
    assert f"{victim} exited (signal 9)" in err
    requeues = [e for e in read_logs(run_dir) if e["event"] == "requeue" and e["worker"] == victim]
    assert requeues, "the killed worker held no episode: nothing was regenerated"
    assert_invariants(run_dir, epochs=3, groups=6)
    check = subprocess.run(
        [*CLI, "replay", str(run_dir), "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 0, check.stdout + check.stderr


def write_rows(tmp_path: Path) -> Path:
    """Guess rows as a JSONL dataset (the environment plugin plays them)."""
    path = tmp_path / "secrets.jsonl"
    path.write_text("".join(json.dumps({"prompt": "0-9=", "answer": str(s)}) + "\n" for s in range(10)))
    return path
