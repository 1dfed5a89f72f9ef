"""`prl-actors up --set worker.engine=vllm --set model.path=<local Qwen2>`: the vLLM engine trains
through the five actors, as real OS processes (`make test-vllm`; skipped where vLLM is absent)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.conftest import assert_invariants, port_base, read_logs
from tests.vllm_utils import make_checkpoint, needs_vllm, vllm_config

pytestmark = [pytest.mark.vllm, needs_vllm, pytest.mark.timeout(900)]  # vLLM starts in ~1 min

EPOCHS, B, G = 4, 4, 8


def up(run_dir: Path, ckpt: Path) -> subprocess.CompletedProcess[str]:
    sets = {
        "run.epochs": EPOCHS,
        "run.workers": 1,
        "transport.base_port": port_base(),
        "coordinator.groups_per_epoch": B,
        "coordinator.heartbeat_interval_s": 0.5,
        "coordinator.heartbeat_timeout_s": 30.0,  # vLLM's first generate compiles kernels
        "worker.engine": "vllm",
        "worker.group_size": G,
        "worker.gpu_memory_utilization": 0.1,
        "worker.weight_fetch_timeout_s": 120.0,
        "worker.sampling.max_new_tokens": 4,
        "trainer.lr": 1e-2,
        "task.reward": "tests.vllm_utils:digit_share",
        "model.path": str(ckpt),
    }
    argv = [
        sys.executable,
        "-m",
        "prl_actors.cli.main",
        "up",
        "--config",
        "configs/demo.yaml",
        "--run-dir",
        str(run_dir),
    ]
    argv += ["--set", "eval.every_epochs=0"]  # demo.yaml evaluates; the rows checked here are the epochs'
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=420, cwd=Path(__file__).parent.parent)


def test_up_trains_with_the_vllm_engine(tmp_path: Path) -> None:
    ckpt = make_checkpoint(vllm_config(tmp_path), tmp_path / "ckpt")
    run_dir = tmp_path / "run"
    out = up(run_dir, ckpt)
    print(out.stderr[-3000:])
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        print({k: r.get(k) for k in ("epoch", "version", "reward_mean", "accuracy", "gen_s", "train_s", "wall_s")})
    assert [(r["epoch"], r["version"]) for r in rows] == [(e, e + 1) for e in range(EPOCHS)]
    assert_invariants(run_dir, epochs=EPOCHS, groups=B)
    loaded = [e for e in read_logs(run_dir) if e["event"] == "span_end" and e.get("span") == "weight_sync"]
    assert {e["new_version"] for e in loaded} == set(range(EPOCHS))  # vLLM took every published version
    final = load_file(str(run_dir / f"checkpoints/v{EPOCHS}/model/model.safetensors"))
    init = load_file(str(ckpt / "model.safetensors"))
    assert max((final[k] - init[k]).abs().max().item() for k in init) > 1e-4  # training moved the weights
