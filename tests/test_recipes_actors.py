"""Each shipped recipe through the five actors: two epochs periodic (3 workers) and sync (1 worker)
end at the same weights, with M x mu optimizer steps and one published version per epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from prl_actors.config import load_config
from prl_actors.launch.process import LocalCluster
from prl_actors.replay import load_run
from prl_actors.replay.checks import invariant_checks
from tests.conftest import assert_invariants, read_logs

pytestmark = pytest.mark.integration

RECIPES = Path(__file__).resolve().parents[1] / "configs" / "recipes"
GROUPS = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from prl_actors.launch import build

    root = tmp_path_factory.mktemp("model")
    return build.model_dir(recipe_config("grpo", root, "sync", None), root)


def recipe_config(recipe: str, run_dir: Path, mode: str, model: Path | None):  # type: ignore[no-untyped-def]
    shipped = load_config(RECIPES / f"{recipe}.yaml")
    return load_config(
        RECIPES / f"{recipe}.yaml",
        {
            "run.run_dir": str(run_dir),
            "run.epochs": 2,
            "run.mode": mode,
            "run.name": f"{recipe}-{mode}",
            "transport.kind": "inproc",
            "coordinator.groups_per_epoch": GROUPS,
            "worker.group_size": 4,
            "model.warm_start_steps": 300,
            "model.path": str(model) if model else None,
            "trainer.num_minibatches": min(shipped.trainer.num_minibatches, GROUPS),
        },
    )


def run(recipe: str, run_dir: Path, mode: str, model: Path, workers: int) -> None:
    cfg = recipe_config(recipe, run_dir, mode, model)
    cluster = LocalCluster(cfg, workers=workers, log_dir=run_dir / "logs")
    try:
        assert cluster.wait(120), f"the {recipe} run did not finish"
    finally:
        cluster.close()
    if not (run_dir / "config.yaml").is_file():  # what `up` writes; replay --check reads M x mu from it
        (run_dir / "config.yaml").write_text(cfg.dump())


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES.glob("*.yaml")))
def test_recipe_periodic_equals_sync_through_the_actors(tmp_path: Path, model_dir: Path, recipe: str) -> None:
    run(recipe, tmp_path / "periodic", "periodic", model_dir, workers=3)
    run(recipe, tmp_path / "sync", "sync", model_dir, workers=1)
    cfg = recipe_config(recipe, tmp_path, "sync", model_dir)
    inner = cfg.trainer.num_minibatches * cfg.trainer.num_iterations
    for mode in ("periodic", "sync"):
        if not cfg.coordinator.dynamic_sampling:  # with it, replay's checks below know which groups train
            assert_invariants(tmp_path / mode, epochs=2, groups=GROUPS)
        steps = [e for e in read_logs(tmp_path / mode) if e["event"] == "optimizer_step"]
        assert [s["optimizer_steps"] for s in steps] == [inner, inner]
        rows = [json.loads(line) for line in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()]
        assert [r["version"] for r in rows] == [1, 2]
        checks = {c.name: c for c in invariant_checks(load_run(tmp_path / mode))}  # replay --check
        assert all(c.ok for c in checks.values()), {n: c.violations for n, c in checks.items()}
    a = load_file(str(tmp_path / "periodic/checkpoints/v2/model/model.safetensors"))
    b = load_file(str(tmp_path / "sync/checkpoints/v2/model/model.safetensors"))
    init = load_file(str(model_dir / "model.safetensors"))
    assert max((b[k] - init[k]).abs().max().item() for k in b) > 1e-4
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=1e-4, msg=k)
