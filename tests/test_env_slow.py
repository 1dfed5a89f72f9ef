"""Slow tier: `prl-actors up --config configs/cartpole.yaml` solves CartPole (mean return >= 475 over
100 episodes) with env actors in separate processes; `replay --check` passes on its logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import port_base

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mode", ["acting", "remote"])
def test_cartpole_up_solves(run_dir: Path, mode: str) -> None:
    cmd = [sys.executable, "-m", "prl_actors.cli.main", "up", "--config", str(ROOT / "configs" / "cartpole.yaml")]
    cmd += ["--run-dir", str(run_dir), "--set", f"env.mode={mode}", "--set", f"transport.base_port={port_base()}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["solved"] and rows[-1]["return_mean"] >= 475, rows[-1]
    assert "SOLVED" in done.stderr
    check = subprocess.run(
        [sys.executable, "-m", "prl_actors.cli.main", "replay", str(run_dir), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert check.returncode == 0, check.stdout[-3000:]
