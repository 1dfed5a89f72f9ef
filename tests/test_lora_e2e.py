"""LoRA through the five actors: configs/lora.yaml on the built-in model (periodic == sync, only the
adapter travels, the workers generate with it) and a Llama checkpoint with chat-formatted prompts,
a resumed epoch and the merged export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from prl_actors.cli.main import app
from prl_actors.config import Config, load_config
from prl_actors.launch.process import LocalCluster
from prl_actors.model.tiny import build_family
from prl_actors.training.packing import collate, response_logprobs
from tests.conftest import assert_invariants, port_base, read_logs

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
ADAPTER = "adapter/adapter_model.safetensors"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from prl_actors.launch import build

    root = tmp_path_factory.mktemp("model")
    return build.model_dir(lora_config(root, "sync", None), root)


def lora_config(run_dir: Path, mode: str, model: Path | None, **extra: object) -> Config:
    return load_config(
        ROOT / "configs/lora.yaml",
        {
            "run.run_dir": str(run_dir),
            "run.epochs": 2,
            "run.mode": mode,
            "run.name": f"lora-{mode}-{port_base()}",
            "transport.kind": "inproc",
            "coordinator.groups_per_epoch": 4,
            "worker.group_size": 4,
            "model.warm_start_steps": 300,
            "model.path": str(model) if model else None,
            **extra,
        },
    )


def run(cfg: Config, workers: int, log_dir: Path) -> None:
    cluster = LocalCluster(cfg, workers=workers, log_dir=log_dir)
    try:
        assert cluster.wait(180), "the LoRA run did not finish"
    finally:
        cluster.close()


def synced(run_dir: Path) -> list[dict]:  # type: ignore[type-arg]
    return [e for e in read_logs(run_dir) if e["event"] == "span_end" and e.get("span") == "weight_sync"]


def test_lora_periodic_equals_sync_through_the_actors(tmp_path: Path, model_dir: Path) -> None:
    """configs/lora.yaml (beta > 0: the reference is the adapter switched off): 3 workers streaming
    vs 1 worker in sync mode give the same adapter, only the adapter travels, and the workers'
    log-probs (base + hooked adapter) agree with the trainer's (peft) ones."""
    for mode, workers in (("periodic", 3), ("sync", 1)):
        run(lora_config(tmp_path / mode, mode, model_dir), workers, tmp_path / mode / "logs")
        assert_invariants(tmp_path / mode, epochs=2, groups=4)
    a = load_file(str(tmp_path / "periodic/checkpoints/v2" / ADAPTER))
    b = load_file(str(tmp_path / "sync/checkpoints/v2" / ADAPTER))
    assert a.keys() == b.keys() and len(a) == 2 * 7 * 2  # A and B of 7 projections in 2 layers
    assert max(t.abs().max().item() for k, t in b.items() if "lora_B" in k) > 1e-4  # it trained ...
    for k in a:  # ... identically, up to float summation order
        torch.testing.assert_close(a[k], b[k], atol=2e-5, rtol=1e-4, msg=k)
    assert not (tmp_path / "periodic/checkpoints/v2/model").exists()  # no copy of the base

    adapter_bytes = sum(t.numel() * t.element_size() for t in a.values())
    base_bytes = (model_dir / "model.safetensors").stat().st_size
    events = synced(tmp_path / "periodic")
    assert {e["new_version"] for e in events} == {0, 1}
    assert all(adapter_bytes < e["bytes"] < adapter_bytes + 1000 for e in events)  # adapter + its description
    assert adapter_bytes < base_bytes / 5  # r = 8 on every projection of a 64-wide model: 17%
    rows = [json.loads(line) for line in (tmp_path / "periodic/metrics.jsonl").read_text().splitlines()]
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6) and rows[1]["kl"] > 1e-6  # the reference path ran
    for r in rows:  # the engines sampled from the adapted policy the trainer scores
        assert 0.0 <= r["logprob_diff_mean"] <= r["logprob_diff_max"] < 1e-4


def llama_config(run_dir: Path, model: Path, epochs: int, resume: bool) -> Config:
    return load_config(
        ROOT / "configs/lora.yaml",
        {
            "run.run_dir": str(run_dir),
            "run.name": f"lora-llama-{port_base()}",
            "run.epochs": epochs,
            "run.resume": resume,
            "transport.kind": "inproc",
            "coordinator.groups_per_epoch": 4,
            "worker.group_size": 4,
            "worker.sampling.max_new_tokens": 8,
            "model.path": str(model),
            "trainer.lr": 0.05,
            "trainer.lora.r": 4,
            "trainer.lora.export_merged": True,
            "task.name": "math",
            "task.chat_template": True,
            "task.system_prompt": "Answer with a number.",
            "task.reward": "tests.test_families_e2e:char_variety",
        },
    )


def test_lora_on_a_llama_checkpoint_resumes_and_exports(tmp_path: Path) -> None:
    model = build_family("llama", tmp_path / "llama")
    run_dir = tmp_path / "run"
    run(llama_config(run_dir, model, epochs=2, resume=False), 1, run_dir / "logs")
    assert_invariants(run_dir, epochs=2, groups=4)
    run(llama_config(run_dir, model, epochs=3, resume=True), 1, tmp_path / "logs-resumed")
    resumed = [e for e in map(json.loads, (tmp_path / "logs-resumed/trainer.jsonl").read_text().splitlines())]
    assert [e["new_version"] for e in resumed if e["event"] == "resumed"] == [2]
    assert sorted(e["msg_epoch"] for e in resumed if e["event"] == "train_group") == [2] * 4

    # the merged export of v3: a plain model computing base + (alpha / r) B @ A
    ckpt = run_dir / "checkpoints/v3"
    merged = AutoModelForCausalLM.from_pretrained(str(ckpt / "merged"), local_files_only=True)
    base = AutoModelForCausalLM.from_pretrained(str(model), local_files_only=True)
    adapter = load_file(str(ckpt / ADAPTER))
    scale = 16 / 4  # configs/lora.yaml alpha / r
    name = "model.layers.0.self_attn.q_proj"
    a, b = adapter[f"base_model.model.{name}.lora_A.weight"], adapter[f"base_model.model.{name}.lora_B.weight"]
    want = base.get_submodule(name).weight + scale * b @ a
    assert (b @ a).abs().max() > 1e-4
    torch.testing.assert_close(merged.get_submodule(name).weight, want, atol=1e-6, rtol=0)

    out = tmp_path / "exported"  # the command does the same from the run directory
    result = CliRunner().invoke(app, ["export-merged", str(run_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    again = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert torch.equal(again.get_submodule(name).weight, merged.get_submodule(name).weight)
    ids = [[1, 5, 9, 12]]
    batch = collate([(ids[0], [[7, 8, 3]])], True)
    with torch.no_grad():
        assert (response_logprobs(again.eval(), batch) - response_logprobs(base.eval(), batch)).abs().max() > 1e-4


def test_bad_lora_targets_are_refused_before_any_actor_starts(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "up",
            "--config",
            str(ROOT / "configs/lora.yaml"),
            "--run-dir",
            str(tmp_path / "run"),
            "--set",
            "trainer.lora.target_modules=[q_proj, qkv]",
            "--set",
            "model.warm_start_steps=0",
        ],
    )
    assert result.exit_code == 2
    assert "trainer.lora.target_modules: 'qkv' matches no layer" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "run" / "logs").exists()
