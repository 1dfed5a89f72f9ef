"""trainer.is_correction through the five actors: the option reaches the trainer process, every
epoch's metrics row carries the IS-ratio stats (rho ~ 1: the torch engine scores in float32 as the
trainer does), and two epochs periodic (3 workers) and sync (1 worker) end at the same weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from prl_actors.config import Config, load_config
from prl_actors.launch.process import LocalCluster
from prl_actors.replay import load_run
from prl_actors.replay.checks import invariant_checks
from tests.conftest import assert_invariants

pytestmark = pytest.mark.integration

GROUPS = 4


def config(run_dir: Path, mode: str, model: Path | None) -> Config:
    return load_config(
        None,
        {
            "run.run_dir": str(run_dir),
            "run.epochs": 2,
            "run.mode": mode,
            "transport.kind": "inproc",
            "coordinator.groups_per_epoch": GROUPS,
            "worker.group_size": 4,
            "model.warm_start_steps": 300,
            "model.path": str(model) if model else None,
            "trainer.is_correction": "tis",
            "trainer.is_cap": 1.5,
            "trainer.num_minibatches": 2,
        },
    )


def run(run_dir: Path, mode: str, model: Path, workers: int) -> None:
    cfg = config(run_dir, mode, model)
    cluster = LocalCluster(cfg, workers=workers, log_dir=run_dir / "logs")
    try:
        assert cluster.wait(120), f"the {mode} run did not finish"
    finally:
        cluster.close()
    if not (run_dir / "config.yaml").is_file():
        (run_dir / "config.yaml").write_text(cfg.dump())


def test_tis_through_the_actors(tmp_path: Path) -> None:
    from prl_actors.launch import build

    model_dir = build.model_dir(config(tmp_path / "model", "sync", None), tmp_path / "model")
    run(tmp_path / "periodic", "periodic", model_dir, workers=3)
    run(tmp_path / "sync", "sync", model_dir, workers=1)
    for mode in ("periodic", "sync"):
        assert_invariants(tmp_path / mode, epochs=2, groups=GROUPS)
        rows = [json.loads(line) for line in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()]
        assert [r["version"] for r in rows] == [1, 2]
        for r in rows:
            assert abs(r["is_ratio_mean"] - 1) < 1e-4 and r["is_corrected_frac"] == 0, r
            assert not math.isnan(r["is_ratio_min"]) and r["is_ratio_max"] < 1.5
        checks = {c.name: c for c in invariant_checks(load_run(tmp_path / mode))}
        assert all(c.ok for c in checks.values()), {n: c.violations for n, c in checks.items()}
        assert "j=0: 8" in checks["staleness"].summary
    a = load_file(str(tmp_path / "periodic/checkpoints/v2/model/model.safetensors"))
    b = load_file(str(tmp_path / "sync/checkpoints/v2/model/model.safetensors"))
    init = load_file(str(model_dir / "model.safetensors"))
    assert max((b[k] - init[k]).abs().max().item() for k in b) > 1e-4
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=1e-4, msg=k)
