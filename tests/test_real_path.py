"""The real learning plane through the five actors: torch engine, GRPO trainer, real weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prl_actors.config import load_config
from prl_actors.process import LocalCluster
from tests.conftest import assert_invariants, read_logs

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("mode", ["periodic", "sync"])
def test_tiny_lm_trains_through_the_actors(tmp_path: Path, mode: str) -> None:
    run_dir = tmp_path / "run"
    cfg = load_config(
        Path(__file__).resolve().parent.parent / "configs/demo.yaml",
        {
            "run.run_dir": str(run_dir),
            "run.epochs": 2,
            "run.mode": mode,
            "transport.kind": "inproc",
            "run.name": f"real-{mode}",
            "coordinator.groups_per_epoch": 4,
            "worker.group_size": 4,
            "model.warm_start_steps": 20,
        },
    )
    cluster = LocalCluster(cfg, workers=2, log_dir=run_dir / "logs")
    try:
        assert cluster.wait(120), "the real run did not finish"
    finally:
        cluster.close()
    assert_invariants(run_dir, epochs=2, groups=4)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["version"]) for r in rows] == [(0, 1), (1, 2)]
    for key in ("reward_mean", "accuracy", "samples", "samples_per_s", "gen_s", "train_s", "wall_s"):
        assert all(isinstance(r[key], float | int) for r in rows), key
    synced = [e for e in read_logs(run_dir) if e["event"] == "span_end" and e.get("span") == "weight_sync"]
    assert {e["new_version"] for e in synced} == {0, 1}
    assert all(e["bytes"] > 100_000 for e in synced)  # a real state dict went through the publisher
    assert (run_dir / "checkpoints" / "v2" / "DONE").exists()
