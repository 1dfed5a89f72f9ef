"""Reward plugins through `up` (real processes): a sync plugin that hangs cannot make a run
unstoppable (before, the worker 'did not stop within 5s of a signal' and needed SIGKILL), and a
plugin that raises puts its file:line on the console and its traceback in the worker's log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import sim_config
from tests.guard_plugins import HANG_DIR_ENV

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "prl_actors.cli.main"]


def config(tmp_path: Path, reward: str, **extra: object) -> Path:
    cfg = sim_config(tmp_path / "run", transport="tcp", run__epochs=20, task__reward=reward, **extra)
    path = tmp_path / "cfg.yaml"
    path.write_text(cfg.dump())
    return path


def test_a_hanging_sync_reward_does_not_keep_a_stopped_run_alive(tmp_path: Path) -> None:
    path = config(tmp_path, "tests.guard_plugins:hangs", run__stop_grace_s=2.0)
    inside = tmp_path / "inside"
    inside.mkdir()
    env = {**os.environ, HANG_DIR_ENV: str(inside)}
    up = subprocess.Popen([*CLI, "up", "--config", str(path)], stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while len(list(inside.iterdir())) < 2:  # both workers are inside the plugin (not merely assigned)
            assert time.monotonic() < deadline and up.poll() is None, "the workers never reached the plugin"
            time.sleep(0.05)
        t0 = time.monotonic()
        up.send_signal(signal.SIGTERM)
        _, err = up.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if up.poll() is None:
            up.kill()
    assert "did not stop" not in err, err  # before: every worker stuck in the plugin, SIGKILLed
    assert took < 10, f"{took:.1f}s"
    for log in (tmp_path / "run" / "logs").glob("worker-*.jsonl"):
        events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
        assert "reward_abandoned" in events and "actor_crashed" not in events, events[-6:]
        assert events[-1] == "actor_stopped", events[-6:]


def test_a_raising_reward_shows_its_file_and_line_and_logs_its_traceback(tmp_path: Path) -> None:
    from tests.guard_plugins import divides

    line = divides.__code__.co_firstlineno + 3
    out = subprocess.run(
        [*CLI, "up", "--config", str(config(tmp_path, "tests.guard_plugins:divides"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    assert f"ZeroDivisionError: division by zero (guard_plugins.py:{line})" in out.stderr.splitlines()[-1]
    assert "Traceback" not in out.stderr  # one line on the console ...
    logged = [
        json.loads(s)
        for log in (tmp_path / "run" / "logs").glob("worker-*.jsonl")
        for s in log.read_text().splitlines()
    ]
    failed = [e for e in logged if e["event"] == "reward_failed"]
    assert failed and f'guard_plugins.py", line {line}, in divides' in failed[0]["traceback"]  # ... the rest in the log
