"""The sampling and data options through the five actors with the real learning plane (torch engine,
GRPO trainer): periodic == sync (final weights) with each generation control, and with dynamic
sampling and the overlong penalty; the engine's log-probs agree with the trainer's in every epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import read_logs
from tests.test_real_path import model_dir, run  # noqa: F401 - the module's model fixture

pytestmark = pytest.mark.integration

CONTROLS = {
    "top_k": {"worker.sampling.top_k": 4},
    "min_p": {"worker.sampling.min_p": 0.1},
    "repetition_penalty": {"worker.sampling.repetition_penalty": 1.5},
    "stop": {"worker.sampling.stop": ["1"]},
}


def both_modes(tmp_path: Path, model: Path, **extra: object) -> tuple[dict, dict, list[dict]]:  # type: ignore[type-arg]
    """Both modes in float64: summation order then moves weights by ~1e-12, so a sample that differs
    (a token drawn differently, a group kept in one mode only) cannot hide in the tolerance. (float32
    weights differ by up to ~3e-5 after two AdamW steps from summation order alone.)"""
    extra = {"model.dtype": "float64", **extra}
    run(tmp_path / "periodic", "periodic", model, workers=3, **extra)
    run(tmp_path / "sync", "sync", model, workers=1, **extra)
    a = load_file(str(tmp_path / "periodic/checkpoints/v2/model/model.safetensors"))
    b = load_file(str(tmp_path / "sync/checkpoints/v2/model/model.safetensors"))
    rows = [json.loads(line) for line in (tmp_path / "periodic/metrics.jsonl").read_text().splitlines()]
    return a, b, rows


def assert_same(a: dict, b: dict, init: dict) -> None:  # type: ignore[type-arg]
    assert a.keys() == b.keys()
    assert max((b[k] - init[k]).abs().max().item() for k in b) > 1e-4  # the weights really moved ...
    for k in a:  # ... and identically, up to float summation order
        torch.testing.assert_close(a[k], b[k], atol=1e-9, rtol=1e-7, msg=k)


@pytest.mark.parametrize("control", list(CONTROLS))
def test_periodic_equals_sync_with_each_generation_control(tmp_path: Path, model_dir: Path, control: str) -> None:  # noqa: F811
    a, b, rows = both_modes(tmp_path, model_dir, **CONTROLS[control])
    assert_same(a, b, load_file(str(model_dir / "model.safetensors")))
    for r in rows:  # every transform is replayed by the trainer: engine and trainer agree per token
        assert 0.0 <= r["logprob_diff_mean"] <= r["logprob_diff_max"] < 1e-5  # the engine samples in float32
    if control == "stop":  # the stop string ended responses (finished, cut) in the actors too
        sent = [e for e in read_logs(tmp_path / "periodic") if e["event"] == "train_group"]
        assert sent


def test_periodic_equals_sync_with_dynamic_sampling(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    extra = {"coordinator.dynamic_sampling": True, "coordinator.max_sampling_rounds": 3}
    a, b, rows = both_modes(tmp_path, model_dir, **extra)
    assert_same(a, b, load_file(str(model_dir / "model.safetensors")))
    sync_rows = [json.loads(line) for line in (tmp_path / "sync/metrics.jsonl").read_text().splitlines()]
    for r, s in zip(rows, sync_rows, strict=True):
        assert (r["groups_kept"], r["groups_generated"]) == (s["groups_kept"], s["groups_generated"])
        assert r["groups_kept"] == r["groups"] <= r["groups_target"] == 4  # the trainer trained the kept ones
    assert any(r["groups_generated"] > r["groups_kept"] for r in rows), "no group was filtered: rule not exercised"
    events = read_logs(tmp_path / "periodic")
    assert any(e["event"] == "sampling_round" for e in events)


def test_periodic_equals_sync_with_the_overlong_penalty(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    a, b, rows = both_modes(tmp_path, model_dir, **{"task.overlong_buffer": 2, "task.overlong_penalty": 0.5})
    assert_same(a, b, load_file(str(model_dir / "model.safetensors")))
    assert min(r["reward_mean"] for r in rows) < 0.2  # penalised (long responses of the tiny model)
