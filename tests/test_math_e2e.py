"""configs/math.yaml end to end: GSM8K-style parquet prompts in a chat template, the math reward,
through the five actors; `prl-actors up` refusing bad data before any actor starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prl_actors.cli.main import app
from prl_actors.config import Config, load_config
from prl_actors.data import position
from prl_actors.launch import build
from prl_actors.launch.process import LocalCluster
from prl_actors.model.tiny import main as tiny_main
from prl_actors.protocol.messages import Prompt
from prl_actors.tasks.math_task import math_reward, sample_path
from tests.conftest import assert_invariants, port_base

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs/math.yaml"
SMALL = {
    "run.epochs": 2,
    "run.workers": 1,
    "coordinator.groups_per_epoch": 4,
    "worker.group_size": 4,
    "worker.sampling.max_new_tokens": 16,
    "coordinator.heartbeat_timeout_s": 5.0,
}


def gsm8k_parquet(path: Path, drop: int = 0) -> Path:
    """The shipped sample as a GSM8K-shaped parquet file (question / answer '... #### x')."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in Path(sample_path()).read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows[drop:]), path)
    return path


def math_config(run_dir: Path, model_dir: Path, data: Path, **extra: object) -> Config:
    overrides = {
        **SMALL,
        "run.name": f"math{port_base()}",
        "run.run_dir": str(run_dir),
        "transport.kind": "inproc",
        "model.path": str(model_dir),
        "task.prompts_file": str(data),
        **extra,
    }
    return load_config(CONFIG, overrides)


def test_math_config_through_the_actors(tmp_path: Path, family_dirs: dict[str, Path]) -> None:
    run_dir, data = tmp_path / "run", gsm8k_parquet(tmp_path / "train.parquet")
    cfg = math_config(run_dir, family_dirs["qwen2"], data)
    scored: list[tuple[Prompt, str, float]] = []
    cluster = LocalCluster(cfg, log_dir=run_dir / "logs")
    task = cluster.hosts["worker-0"].core.task  # type: ignore[attr-defined]
    score_group = task.score_group

    def spy(prompt: Prompt, prompt_ids: list[int], samples: list) -> object:  # type: ignore[type-arg]
        out = score_group(prompt, prompt_ids, samples)
        scored.extend((prompt, s.text, total) for s, total in zip(samples, out.totals, strict=True))
        return out

    task.score_group = spy
    try:
        assert cluster.wait(240), "the math run did not finish"
    finally:
        cluster.close()
    assert_invariants(run_dir, epochs=2, groups=4)
    expected = {p.prompt: p.answer for e in range(2) for p in build.task(cfg).prompts_for_epoch(e, 4)}
    assert len(scored) == 2 * 4 * 4
    for prompt, response, reward in scored:
        assert prompt.prompt.startswith("<|im_start|>system\nPlease reason step by step")  # templated
        assert expected[prompt.prompt] == prompt.answer and prompt.answer.lstrip("-").isdigit()  # the final number
        assert reward == math_reward("", response, prompt.answer, format_reward=0.1)
    stored = json.loads((run_dir / "checkpoints/v2/data.json").read_text())
    assert (stored["task"], stored["rows"], stored["epoch"], stored["offset"]) == ("math", 40, 2, 8)


def prl_actors(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "prl_actors.cli.main", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ})


def up_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """`prl-actors up` in this process (it stops at its pre-flight checks, before starting actors)."""
    result = CliRunner().invoke(app, ["up", *args])
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def test_up_refuses_bad_rows_and_changed_data(tmp_path: Path, family_dirs: dict[str, Path]) -> None:
    """One error line, exit code 2, before any actor process starts."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "ok?", "answer": "#### 3"}\n{"question": "", "answer": "#### 4"}\n')
    model = ["--set", f"model.path={family_dirs['qwen2']}"]
    out = up_in_process(
        "--config", str(CONFIG), *model, f"--set=task.prompts_file={bad}", f"--run-dir={tmp_path / 'r1'}"
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"error: {bad}:2: 'question' must be a non-empty string" in out.stderr
    assert not (tmp_path / "r1" / "logs").exists()

    data = gsm8k_parquet(tmp_path / "train.parquet")
    run_dir = tmp_path / "r2"
    overrides = {"model.path": str(family_dirs["qwen2"]), "task.prompts_file": str(data), "run.run_dir": str(run_dir)}
    cfg = load_config(CONFIG, overrides)  # what `up` resolved and wrote for the run being resumed
    ckpt = run_dir / "checkpoints" / "v1"
    ckpt.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(cfg.dump())
    position.save(ckpt, build.task(cfg).data_identity(cfg.coordinator.groups_per_epoch), 1)  # as the run left it
    (ckpt / "DONE").write_text("1")
    gsm8k_parquet(data, drop=1)  # the file changed since
    out = up_in_process(
        "--config", str(CONFIG), *model, f"--set=task.prompts_file={data}", f"--run-dir={run_dir}", "--resume"
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "run.resume: the prompt data differ" in out.stderr and "rows: 40 -> 39" in out.stderr


@pytest.mark.slow
def test_math_config_with_prl_actors_up(tmp_path: Path) -> None:
    """The documented commands: a tiny checkpoint, `up` with configs/math.yaml, then `--resume`."""
    model_dir = tmp_path / "tiny-qwen2"
    tiny_main(["qwen2", str(model_dir)])
    args = ["up", "--config", str(CONFIG), "--set", f"model.path={model_dir}", "--run-dir", str(tmp_path / "run")]
    args += [f"--set={k}={v}" for k, v in SMALL.items() if k != "run.epochs"] + [
        f"--set=transport.base_port={port_base()}"
    ]
    first = prl_actors(*args, "--epochs", "2", timeout=600)
    assert first.returncode == 0, first.stderr
    again = prl_actors(*args, "--epochs", "3", "--resume", timeout=600)
    assert again.returncode == 0, again.stderr
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    assert json.loads((tmp_path / "run/checkpoints/v3/data.json").read_text())["offset"] == 12
