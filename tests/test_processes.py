"""`prl-actors up` with one OS process per actor, real tcp sockets (integration tier)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from prl_actors.config import Config
from prl_actors.launch.up import EXIT_STOPPED
from tests.conftest import assert_invariants, read_logs, sim_config, wait_for

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "prl_actors.cli.main"]


def write_config(cfg: Config, path: Path) -> Path:
    path.write_text(cfg.dump())
    return path


def start_up(cfg: Config, tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    config = write_config(cfg, tmp_path / "cfg.yaml")
    cmd = [*CLI, "up", "--config", str(config), *extra]
    return subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 60.0, code: int = 0) -> str:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == code, err
    return err


def test_up_survives_sigkill_of_a_worker(tmp_path: Path, run_dir: Path) -> None:
    cfg = sim_config(
        run_dir, transport="tcp", run__epochs=5, run__workers=3,
        coordinator__groups_per_epoch=12, sim__gen_s_per_token=0.01,
    )  # fmt: skip
    proc = start_up(cfg, tmp_path)
    victim = wait_for(run_dir, lambda e: e["event"] == "assign" and e["epoch"] == 1)["worker"]
    pid = wait_for(run_dir, lambda e: e["event"] == "actor_start" and e["actor"] == victim)["pid"]
    os.kill(pid, signal.SIGKILL)
    err = finish(proc)
    assert f"{victim} exited (signal 9)" in err
    assert "done: 5 epochs" in err
    requeues = [e for e in read_logs(run_dir) if e["event"] == "requeue"]
    assert any(r["worker"] == victim and r["reason"] == "heartbeat_timeout" for r in requeues)
    assert_invariants(run_dir, epochs=5, groups=12)


def test_remote_worker_joins_and_scale_and_status(tmp_path: Path, run_dir: Path) -> None:
    cfg = sim_config(
        run_dir, transport="tcp", run__epochs=8, run__workers=1, sim__gen_s_per_token=0.03,
    )  # fmt: skip
    proc = start_up(cfg, tmp_path)
    coord = cfg.address("coordinator")
    wait_for(run_dir, lambda e: e["event"] == "epoch_open")
    keys = ["--keys", str(run_dir / "keys")]  # the operator's: the run's key directory
    status = subprocess.run([*CLI, "status", "--coordinator", coord, *keys], capture_output=True, text=True, timeout=20)
    assert status.returncode == 0 and "state" in status.stdout and "worker-0" in status.stdout
    bundle = tmp_path / "joiner-keys"  # what a worker on another host gets: its own secret + public keys
    made = subprocess.run([*CLI, "keys", "create", "worker-remote", "--run-dir", str(run_dir)])
    exported = subprocess.run(
        [*CLI, "keys", "export", "worker-remote", "--out", str(bundle), "--run-dir", str(run_dir)]
    )  # the README's join flow (the role key `worker` is never exported)
    assert made.returncode == 0 and exported.returncode == 0
    assert [p.name for p in bundle.glob("*.key_secret")] == ["worker-remote.key_secret"]
    extra = subprocess.Popen(
        [*CLI, "actor", "worker", "--config", str(tmp_path / "cfg.yaml"), "--name", "worker-remote",
         "--coordinator", coord, "--keys", str(bundle)],
    )  # fmt: skip
    scaled = subprocess.run(
        [*CLI, "scale", "--workers", "2", "--coordinator", coord, *keys], capture_output=True, text=True
    )
    assert scaled.returncode == 0, scaled.stderr
    err = finish(proc)
    assert extra.wait(20) == 0
    assert "scaling workers 1 -> 2" in err
    events = read_logs(run_dir)
    remote = [e for e in events if e["actor"] == "worker-remote" and e["event"] == "group_sent"]
    assert remote, "the remote worker never generated"
    assert_invariants(run_dir, epochs=8, groups=6)


def test_up_writes_run_directory(tmp_path: Path, run_dir: Path) -> None:
    cfg = sim_config(run_dir, transport="ipc", run__epochs=2)
    finish(start_up(cfg, tmp_path))
    assert (run_dir / "config.yaml").exists() and (run_dir / "metrics.jsonl").exists()
    names = sorted(p.stem for p in (run_dir / "logs").glob("*.jsonl"))
    assert names == ["buffer", "coordinator", "publisher", "trainer", "worker-0", "worker-1"]
    for e in read_logs(run_dir):
        assert {"event", "actor", "role", "epoch", "version", "t_mono", "t_wall"} <= e.keys()


def test_stop_and_scale_need_the_operator_key_and_status_shows_refusals(tmp_path: Path, run_dir: Path) -> None:
    """`up` over tcp with its keys: the CLI without them is refused at the handshake (a clear error,
    counted in `status`); with the operator key `scale` is bounded by run.max_workers and `stop` works."""
    cfg = sim_config(run_dir, transport="tcp", run__epochs=100, run__max_workers=3, sim__gen_s_per_token=0.01)
    proc = start_up(cfg, tmp_path)
    coord = ["--coordinator", cfg.address("coordinator")]
    keys = ["--keys", str(run_dir / "keys")]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)

    try:
        wait_for(run_dir, lambda e: e["event"] == "epoch_open", timeout=60)
        nokey = cli("stop", *coord)  # no --keys, and no runs/latest here: a plain client
        assert nokey.returncode == 1 and "refused our handshake" in nokey.stderr, nokey.stderr
        too_many = cli("scale", "--workers", "4", *coord, *keys)
        assert too_many.returncode == 1 and "over_limit" in too_many.stderr, too_many.stderr
        status = cli("status", *coord, *keys)
        assert status.returncode == 0 and "coordinator refused: auth_refused" in status.stdout, status.stdout
        stopped = cli("stop", *coord, *keys)
        assert stopped.returncode == 0, stopped.stderr
        err = finish(proc, code=EXIT_STOPPED)  # stopped before its last epoch
    finally:
        if proc.poll() is None:  # a failed assertion: stop the run (and its actors) like Ctrl-C
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    assert "done: 100 epochs" not in err
    done = [e for e in read_logs(run_dir) if e["event"] == "run_done"]
    assert done and done[0]["reason"] == "stop requested: prl-actors stop"
