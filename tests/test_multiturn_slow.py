"""The shipped game learns: `configs/guess.yaml` as it is (its warm start, B, G, lr, epochs), through
the five actors in one process, and the mean reward of its last 5 epochs clearly exceeds that of its
first 5 (docs/TASKS.md has the curve)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from prl_actors.config import load_config
from prl_actors.launch.process import LocalCluster
from tests.conftest import assert_invariants

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_guess_config_raises_its_reward(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = load_config(ROOT / "configs/guess.yaml", {"run.run_dir": str(run_dir), "transport.kind": "inproc"})
    started = time.monotonic()
    cluster = LocalCluster(cfg, workers=cfg.run.workers, log_dir=run_dir / "logs")
    try:
        assert cluster.wait(1200), "the guess run did not finish"
    finally:
        cluster.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve = [r["reward_mean"] for r in rows]
    print("\n" + " ".join(f"{r:.2f}" for r in curve), f"({time.monotonic() - started:.0f}s)")
    assert len(curve) == cfg.run.epochs
    assert_invariants(run_dir, epochs=cfg.run.epochs, groups=cfg.coordinator.groups_per_epoch)
    first, last = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    print(f"first 5 epochs {first:.3f} -> last 5 epochs {last:.3f}")
    assert last >= first + 0.12
