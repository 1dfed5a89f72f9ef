"""Start-up failures are loud: an actor that cannot start exits non-zero with one line naming the
cause (no traceback), and logs the trace and `actor_crashed` in its own log."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import zmq

from prl_actors.config import load_config
from prl_actors.publisher.core import PublisherCore
from prl_actors.records.logs import EventLog
from prl_actors.records.rundir import RunDir
from prl_actors.runtime.core import ActorHost
from tests.conftest import run_keys, sim_config

CLI = [sys.executable, "-m", "prl_actors.cli.main"]


def actor(role: str, config: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    run_keys(load_config(config))  # as `up` would have made them
    t0 = time.monotonic()
    argv = [*CLI, "actor", role, "--config", str(config), *extra]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    return out, time.monotonic() - t0


def events(run_dir: Path, actor_name: str) -> list[dict]:
    return [json.loads(line) for line in RunDir(run_dir).log_path(actor_name).read_text().splitlines()]


def test_a_trainer_whose_checkpoints_are_damaged_fails_at_once_with_the_cause(tmp_path: Path) -> None:
    cfg = sim_config(tmp_path / "run", transport="tcp", run__resume=True)
    ckpt = tmp_path / "run" / "checkpoints" / "v3"
    ckpt.mkdir(parents=True)
    (ckpt / "sim.npz").write_bytes(b"PK\x03\x04 truncated")
    (ckpt / "DONE").write_text("3")  # an unverifiable (old) marker: the load itself fails
    config = tmp_path / "cfg.yaml"
    config.write_text(cfg.dump())
    out, took = actor("trainer", config)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: trainer: failed to start: "), out.stderr
    assert took < 60  # at once (the time is imports on a busy machine), not after a stall
    log = events(tmp_path / "run", "trainer")
    ends = [e["event"] for e in log if e["event"] in ("start_failed", "actor_crashed")]
    assert ends == ["start_failed", "actor_crashed"]
    assert "Traceback" in next(e for e in log if e["event"] == "start_failed")["trace"]


def test_a_corrupt_model_config_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2", "hidden_size": ')  # cut short
    cfg = sim_config(tmp_path / "run", transport="tcp")
    config = tmp_path / "cfg.yaml"
    config.write_text(
        cfg.dump()
        .replace("engine: sim", "engine: torch")
        .replace("learner: sim", "learner: grpo")
        .replace("path: null", f"path: {model}")
    )
    out, _ = actor("worker", config, "--name", "worker-0")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: worker-0: failed to start: "), out.stderr


class Exploding(PublisherCore):
    def start(self, now: float) -> None:
        raise RuntimeError("engine load failed: out of memory\nsecond line of detail")


def test_an_exception_in_start_crashes_the_actor_with_a_one_line_error(tmp_path: Path) -> None:
    ctx = zmq.Context()
    core = Exploding("publisher", EventLog("publisher", "publisher", tmp_path / "p.jsonl"), 4096, 5.0)
    host = ActorHost.start(core, ctx, f"inproc://boom-{id(core)}", {})._actor_weakref()
    try:  # before: a handler_error in the log, and an actor that lived on doing nothing
        assert host is not None and host.done.wait(5.0), "the actor kept running after its start failed"
        assert host.error == "failed to start: RuntimeError: engine load failed: out of memory"
    finally:
        ctx.destroy(linger=0)
