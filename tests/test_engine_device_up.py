"""worker.impl=gpu through the actors: `prl-actors up` on the demo config, every worker on the gpu
decode path (on the CPU), the record checked by `prl-actors replay --check`, the engine's log-probs
those the trainer computes (the same samples as the cpu path: tests/test_engine_device_path.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# the gpu decode path against the cpu one: test_engine_device_path (fast); `up` on the demo config: many
pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "prl_actors.cli.main"]


def up(run_dir: Path, impl: str) -> list[dict]:
    cmd = [*CLI, "up", "--config", str(ROOT / "configs/demo.yaml"), "--run-dir", str(run_dir), "--epochs", "3"]
    out = subprocess.run([*cmd, "--set", f"worker.impl={impl}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if "reward_mean" in r]  # the epochs' rows (not evaluations)


def test_workers_on_the_gpu_path_train_through_the_actors(tmp_path: Path) -> None:
    gpu = up(tmp_path / "gpu", "gpu")
    check = subprocess.run(
        [*CLI, "replay", str(tmp_path / "gpu"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout[-2000:]
    paths = [
        json.loads(line)
        for f in sorted((tmp_path / "gpu" / "logs").glob("worker-*.jsonl"))
        for line in f.read_text().splitlines()
        if '"decode_path"' in line
    ]
    assert paths and all(e["impl"] == "gpu" for e in paths)  # every worker said which path it took
    assert len(gpu) == 3 and all(e["logprob_diff_max"] < 1e-5 for e in gpu)  # behaviour log-probs == trainer's
