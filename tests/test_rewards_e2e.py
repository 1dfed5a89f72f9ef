"""Rewards through the actors: weighted parts reach metrics.jsonl as reward/<name>; a reward plugin
that raises on some samples, always, or returns NaN never hangs a run and never trains NaN:
`on_reward_error: zero` completes with counted warnings, `fail` ends `up` with the one line."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from prl_actors.config import Config
from prl_actors.launch.process import LocalCluster
from tests.conftest import assert_invariants, read_logs, sim_config

CLI = [sys.executable, "-m", "prl_actors.cli.main"]
PARTS = [{"fn": "add", "name": "acc"}, {"fn": "tests.reward_plugins:half", "weight": 0.5}]


def run_inproc(cfg: Config, timeout: float = 60.0) -> list[dict]:
    cluster = LocalCluster(cfg, workers=2, log_dir=Path(cfg.run.run_dir) / "logs")
    try:
        assert cluster.wait(timeout), "run did not finish"
    finally:
        cluster.close()
    lines = (Path(cfg.run.run_dir) / "metrics.jsonl").read_text().splitlines()
    return [msgspec.json.decode(r) for r in lines]


@pytest.mark.parametrize("mode", ["periodic", "sync"])
def test_per_reward_means_reach_the_metrics(run_dir: Path, mode: str) -> None:
    cfg = sim_config(run_dir, run__mode=mode, task__rewards=PARTS)
    rows = run_inproc(cfg)
    assert len(rows) == 3
    for row in rows:
        assert row["reward/half"] == 0.5
        assert 0.0 <= row["reward/acc"] <= 1.0
        assert row["reward_mean"] == pytest.approx(row["reward/acc"] + 0.5 * 0.5)
    assert_invariants(run_dir, epochs=3, groups=6)


def test_a_run_without_task_rewards_reports_no_parts(run_dir: Path) -> None:
    rows = run_inproc(sim_config(run_dir, run__epochs=1))
    assert not [k for k in rows[0] if k.startswith("reward/")]


@pytest.mark.parametrize("plugin", ["flaky", "always_raises", "nan_sometimes"])
def test_zero_policy_completes_with_counted_warnings_and_finite_metrics(
    run_dir: Path, plugin: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rewards = [{"fn": "add", "name": "acc"}, {"fn": f"tests.reward_plugins:{plugin}", "name": "bad"}]
    cfg = sim_config(run_dir, task__rewards=rewards, task__on_reward_error="zero")
    rows = run_inproc(cfg)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: worker-")]
    assert said and all("scored 0 (task.on_reward_error: zero), 1" in line for line in said)  # 1st, 10th ...
    assert len(rows) == 3 and all(math.isfinite(v) for row in rows for v in row.values() if isinstance(v, float))
    warnings = [e for e in read_logs(run_dir) if e["event"] == "reward_error"]
    assert warnings and all("reward 'bad' (tests.reward_plugins:" in w["error"] for w in warnings)
    for worker in {w["actor"] for w in warnings}:  # counted per worker (all logged: under the rate limit)
        counts = [w["count"] for w in warnings if w["actor"] == worker]
        assert counts == list(range(1, len(counts) + 1))
    assert_invariants(run_dir, epochs=3, groups=6)


E2E = pytest.mark.e2e


@pytest.mark.integration
@pytest.mark.parametrize(
    ("plugin", "says"),
    [
        # one failing reward through `up` stays in `make test`; the others' lines: test_rewards (fast)
        pytest.param("flaky", r"raised on prompt \d+ \(row \d+\) sample 2: ValueError: cannot score", marks=E2E),
        ("always_raises", r"raised on prompt \d+ \(row \d+\) sample 0: RuntimeError: the verifier is broken"),
        pytest.param(
            "nan_sometimes",
            r"returned nan on prompt \d+ \(row \d+\) sample 1 \(rewards must be finite numbers\)",
            marks=E2E,
        ),
    ],
)
def test_fail_policy_ends_up_with_the_one_line_within_seconds(tmp_path: Path, plugin: str, says: str) -> None:
    import re

    run_dir = tmp_path / "run"
    cfg = sim_config(
        run_dir,
        transport="tcp",
        run__epochs=20,
        task__rewards=[{"fn": f"tests.reward_plugins:{plugin}", "name": "bad"}],
    )
    config = tmp_path / "cfg.yaml"
    config.write_text(cfg.dump())
    t0 = time.monotonic()
    out = subprocess.run([*CLI, "up", "--config", str(config)], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert out.returncode == 1, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert all(re.search(r"reward 'bad' \(tests.reward_plugins:\w+\) " + says, line) for line in errors), out.stderr
    last = out.stderr.strip().splitlines()[-1]  # each failing worker said it; `up` ends with the first one
    assert re.fullmatch(r"error: worker-\d+ exited \(code 1: reward 'bad' .*\)", last), out.stderr
    assert "Traceback" not in out.stderr
    assert took < 60, f"{took:.0f}s"  # start-up and one failure, not a stall
    metrics = run_dir / "metrics.jsonl"
    assert not metrics.exists() or "NaN" not in metrics.read_text()


@pytest.mark.slow  # ~25 s: two runs of the tiny LM
def test_weighted_rewards_with_row_columns_keep_periodic_equal_to_sync(tmp_path: Path) -> None:
    """The tiny LM on a JSONL task whose rows carry an extra column, scored by three weighted rewards
    (exact match, a reward reading the row, a batched one): the columns reach the workers through
    the prompts' row index, and periodic (3 workers) trains the same weights as sync (1 worker)."""
    import json

    import torch
    from safetensors.torch import load_file

    from prl_actors.config import load_config
    from prl_actors.launch import build

    data = tmp_path / "d.jsonl"
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "difficulty": a / 10} for a in range(6) for b in range(6)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rewards = [
        {"fn": "add", "name": "acc"},
        {"fn": "tests.reward_plugins:difficulty", "weight": 0.5},
        {"fn": "tests.reward_plugins:ranks", "batched": True, "weight": 0.1},
    ]

    def config(run_dir: Path, mode: str, model: Path | None) -> Config:
        demo = Path(__file__).resolve().parent.parent / "configs/demo.yaml"
        return load_config(
            demo,
            {
                "run.run_dir": str(run_dir), "run.epochs": 2, "run.mode": mode, "transport.kind": "inproc",
                "run.name": f"rw-{mode}", "coordinator.groups_per_epoch": 4, "worker.group_size": 4,
                "model.warm_start_steps": 300, "model.path": str(model) if model else None,
                "task.name": "jsonl", "task.prompts_file": str(data), "task.rewards": rewards,
                "eval.every_epochs": 0,  # demo.yaml evaluates; the rows compared here are the epochs'
            },
        )  # fmt: skip

    model = build.model_dir(config(tmp_path / "m", "sync", None), tmp_path / "m")
    metrics = {}
    for mode, workers in (("periodic", 3), ("sync", 1)):
        cfg = config(tmp_path / mode, mode, model)
        cluster = LocalCluster(cfg, workers=workers, log_dir=tmp_path / mode / "logs")
        try:
            assert cluster.wait(120), f"the {mode} run did not finish"
        finally:
            cluster.close()
        assert_invariants(tmp_path / mode, epochs=2, groups=4)
        metrics[mode] = [json.loads(r) for r in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()]
    task_rows = {r["prompt"]: r["difficulty"] for r in rows}
    from prl_actors.launch import build

    task = build.task(config(tmp_path / "sync", "sync", model))
    for epoch, row in enumerate(metrics["sync"]):
        picked = [task_rows[p.prompt] for p in task.prompts_for_epoch(epoch, 4)]
        assert row["reward/difficulty"] == pytest.approx(sum(picked) / 4)  # the row's column, per prompt
        assert row["reward/ranks"] == pytest.approx(1.5)  # ranks 0..3 in every group
        total = row["reward/acc"] + 0.5 * row["reward/difficulty"] + 0.1 * row["reward/ranks"]
        assert row["reward_mean"] == pytest.approx(total)
    for a, b in zip(metrics["periodic"], metrics["sync"], strict=True):
        assert {k: v for k, v in a.items() if k.startswith("reward")} == pytest.approx(
            {k: v for k, v in b.items() if k.startswith("reward")}
        )
    wa = load_file(str(tmp_path / "periodic/checkpoints/v2/model/model.safetensors"))
    wb = load_file(str(tmp_path / "sync/checkpoints/v2/model/model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=2e-5, rtol=1e-4, msg=k)
