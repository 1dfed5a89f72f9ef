"""The real learning plane through the five actors: torch engine, GRPO trainer, real weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from prl_actors.config import load_config
from prl_actors.launch.process import LocalCluster
from tests.conftest import assert_invariants, read_logs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One warm-started built-in model for the module (its sampled answers are partly right)."""
    from prl_actors.launch import build

    root = tmp_path_factory.mktemp("model")
    return build.model_dir(real_config(root, "sync", None), root)


def real_config(run_dir: Path, mode: str, model: Path | None, **extra: object):  # type: ignore[no-untyped-def]
    return load_config(
        Path(__file__).resolve().parent.parent / "configs/demo.yaml",
        {
            "run.run_dir": str(run_dir),
            "run.epochs": 2,
            "run.mode": mode,
            "transport.kind": "inproc",
            "run.name": f"real-{mode}",
            "coordinator.groups_per_epoch": 4,
            "worker.group_size": 4,
            "model.warm_start_steps": 300,
            "model.path": str(model) if model else None,
            "eval.every_epochs": 0,  # demo.yaml evaluates; these runs compare training alone
            **extra,
        },
    )


def run(run_dir: Path, mode: str, model: Path, workers: int = 2, **extra: object) -> None:
    cfg = real_config(run_dir, mode, model, **extra)
    cluster = LocalCluster(cfg, workers=workers, log_dir=run_dir / "logs")
    try:
        assert cluster.wait(120), "the real run did not finish"
    finally:
        cluster.close()


@pytest.mark.parametrize("mode", ["periodic", "sync"])
def test_tiny_lm_trains_through_the_actors(tmp_path: Path, mode: str, model_dir: Path) -> None:
    run_dir = tmp_path / "run"
    run(run_dir, mode, model_dir)
    assert_invariants(run_dir, epochs=2, groups=4)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["version"]) for r in rows] == [(0, 1), (1, 2)]
    for key in ("reward_mean", "accuracy", "samples", "samples_per_s", "gen_s", "train_s", "wall_s"):
        assert all(isinstance(r[key], float | int) for r in rows), key
    for r in rows:  # the engines' behaviour log-probs agree with the trainer's, and it is on record
        assert 0.0 <= r["logprob_diff_mean"] <= r["logprob_diff_max"] < 1e-4
    synced = [e for e in read_logs(run_dir) if e["event"] == "span_end" and e.get("span") == "weight_sync"]
    assert {e["new_version"] for e in synced} == {0, 1}
    assert all(e["bytes"] > 100_000 for e in synced)  # a real state dict went through the publisher
    assert (run_dir / "checkpoints" / "v2" / "DONE").exists()


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_periodic_equals_sync_end_to_end(tmp_path: Path, model_dir: Path, beta: float) -> None:
    """The claim: streaming groups into the trainer as they arrive gives the synchronous result,
    also with the KL term (beta > 0: the reference model's forward; its gradient is non-zero from
    the second epoch on, once the policy has moved away from the reference)."""
    extra = {"trainer.beta": beta}
    run(tmp_path / "periodic", "periodic", model_dir, workers=3, **extra)
    run(tmp_path / "sync", "sync", model_dir, workers=1, **extra)
    a = load_file(str(tmp_path / "periodic/checkpoints/v2/model/model.safetensors"))
    b = load_file(str(tmp_path / "sync/checkpoints/v2/model/model.safetensors"))
    init = load_file(str(model_dir / "model.safetensors"))
    assert a.keys() == b.keys()
    moved = max((b[k] - init[k]).abs().max().item() for k in b)
    assert moved > 1e-4  # the weights really changed over the two steps ...
    for k in a:  # ... and identically, up to float summation order
        torch.testing.assert_close(a[k], b[k], atol=2e-5, rtol=1e-4, msg=k)
    if beta:
        rows = [json.loads(line) for line in (tmp_path / "periodic/metrics.jsonl").read_text().splitlines()]
        assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6) and rows[1]["kl"] > 1e-6  # the KL path ran
