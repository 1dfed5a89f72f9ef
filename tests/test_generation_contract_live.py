"""A hand-started worker (`prl-actors actor worker --coordinator ...`) whose sampling settings differ
from the run's is refused (runtime/contract.py): it exits non-zero with one line naming the setting, the
coordinator logs the refusal, the run completes with `replay --check` green; a matching one joins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prl_actors.cli.main import app
from tests.conftest import assert_invariants, read_logs, sim_config, wait_for

CLI = [sys.executable, "-m", "prl_actors.cli.main"]


@pytest.mark.e2e  # the refusal: test_generation_contract (cores); a hand-started joiner: test_processes
def test_a_hand_started_worker_with_another_temperature_is_refused_and_a_matching_one_joins(
    tmp_path: Path, run_dir: Path
) -> None:
    cfg = sim_config(run_dir, transport="tcp", run__epochs=6, run__workers=1, sim__gen_s_per_token=0.02)
    config = tmp_path / "cfg.yaml"
    config.write_text(cfg.dump())
    up = subprocess.Popen(
        [*CLI, "up", "--config", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(run_dir, lambda e: e["event"] == "epoch_open")
        joiner = [*CLI, "actor", "worker", "--config", str(config), "--coordinator", cfg.address("coordinator")]
        joiner += ["--keys", str(run_dir / "keys")]
        same = subprocess.Popen([*joiner, "--name", "worker-same"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        hot = subprocess.run(
            [*joiner, "--name", "worker-hot", "--set", "worker.sampling.temperature=0.5"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert hot.returncode != 0
        line = "worker.sampling.temperature is 0.5 on worker-hot but 1.0 in the run"
        assert [x for x in hot.stderr.splitlines() if line in x], hot.stderr
        assert "Traceback" not in hot.stderr
        _, err = up.communicate(timeout=60)
        assert up.returncode == 0, err
        assert same.wait(20) == 0
    finally:
        up.kill()
    events = read_logs(run_dir)
    refused = [e for e in events if e["actor"] == "coordinator" and e["event"] == "refused"]
    assert [e["sender"] for e in refused] == ["worker-hot"] and line in refused[0]["detail"]
    assert any(e["event"] == "member_join" and e["member"] == "worker-same" for e in events)
    assert not any(e["event"] == "member_join" and e["member"] == "worker-hot" for e in events)
    assert_invariants(run_dir, epochs=6, groups=6)
    check = CliRunner().invoke(app, ["replay", str(run_dir), "--check"])
    assert check.exit_code == 0, check.output
