"""The trainer group, `make test-dist` tier (marker dist; gloo on CPU, 2 ranks, real processes):
FSDP2 gives world size 1's weights; its sharded checkpoint resumes exactly, also on another number
of ranks; a hung rank fails the step within trainer.dist_timeout_s; a whole `up` run whose rank 1 is
killed mid-epoch ends loudly, resumes with --resume, and `prl-actors replay --check` passes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prl_actors.trainer.rank_group import RankGroupError
from prl_bench.common import free_port
from tests.conftest import port_base, read_logs, wait_for
from tests.dist_utils import group_of, max_diff, rollouts, side_by_side, train_epoch, with_trainer
from tests.learning_utils import tiny_config

pytestmark = pytest.mark.dist
CLI = [sys.executable, "-m", "prl_actors.cli.main"]


@pytest.mark.parametrize(("dtype", "atol"), [("float64", 1e-9), ("float32", 1e-5)])
def test_two_fsdp2_ranks_give_the_weights_of_one_process(tmp_path: Path, dtype: str, atol: float) -> None:
    """float64 measured 1e-16, float32 within the bound test_grpo_equivalence states for a reordered
    float32 sum (AdamW's first step magnifies rounding of near-zero entries); the effect is ~1e-3."""
    cfg, model_dir, groups = rollouts(tmp_path, trainer__max_grad_norm=1e6, model__dtype=dtype)
    run = side_by_side(cfg, model_dir, groups, "fsdp2")
    assert max_diff(run.one, run.initial) > 100 * atol
    assert max_diff(run.one, run.group) < atol
    assert [m["tokens"] for m in run.group_metrics] == [m["tokens"] for m in run.one_metrics]
    assert run.group_metrics[-1]["grad_norm"] == pytest.approx(run.one_metrics[-1]["grad_norm"], rel=1e-4)


def test_fsdp2_checkpoint_resumes_exactly_on_2_ranks_and_reshards_onto_1(tmp_path: Path) -> None:
    cfg, model_dir, groups = rollouts(tmp_path)
    two = group_of(cfg, model_dir, "fsdp2")
    try:
        train_epoch(two, groups)
        two.save_checkpoint(tmp_path / "ckpt")
        train_epoch(two, groups[1:4], 1)  # the run that goes on
        went_on = two.weights()
    finally:
        two.close()
    ckpt = tmp_path / "ckpt"
    assert {p.name for p in ckpt.iterdir()} >= {"sharded", "model", "trainer_state.pt"}
    assert (ckpt / "model" / "config.json").is_file() and (ckpt / "model" / "tokenizer.json").is_file()
    for world_size in (2, 1):  # DCP reshards the optimizer state and the weights on load
        resumed = group_of(cfg, model_dir, "fsdp2", world_size=world_size)
        try:
            resumed.load_checkpoint(ckpt)
            assert resumed.version == 1
            train_epoch(resumed, groups[1:4], 1)
            assert max_diff(resumed.weights(), went_on) < 1e-9, world_size
        finally:
            resumed.close()


def test_a_hung_rank_fails_the_step_within_the_timeout(tmp_path: Path) -> None:
    cfg, model_dir, groups = rollouts(tmp_path)
    fatal: list[str] = []
    two = group_of(cfg, model_dir, "fsdp2", dist_timeout_s=3.0)
    two.on_fatal = fatal.append
    victim = two.procs[0].proc  # a supervisor.Child: its process
    try:
        two.begin_epoch(0, len(groups))
        os.kill(victim.pid, signal.SIGSTOP)  # alive, sockets open, silent: only a timeout can tell
        t0 = time.monotonic()
        with pytest.raises(RankGroupError, match="trainer rank group failed"):
            for g in groups:
                two.accumulate(g)
            two.step()
        waited = time.monotonic() - t0
        assert fatal and "trainer rank group failed" in fatal[0]
        assert 3.0 <= waited < 3.0 + 10.0, waited  # the timeout, then the failure: not a hang
    finally:
        if victim.poll() is None:
            os.kill(victim.pid, signal.SIGKILL)
        two.close()
    assert victim.wait(10) == -signal.SIGKILL  # rank 0 ended the rank it started


# --- a whole run ---------------------------------------------------------------------------------


def run_config(run_dir: Path, epochs: int) -> Path:
    cfg = tiny_config(
        **{
            "run.run_dir": str(run_dir),
            "run.name": f"d{port_base()}",
            "run.epochs": epochs,
            "run.workers": 1,
            "transport.base_port": port_base(),
            "coordinator.groups_per_epoch": 6,
            "coordinator.heartbeat_timeout_s": 10.0,
            "trainer.world_size": 2,
            "trainer.strategy": "fsdp2",
            "trainer.dist_timeout_s": 30.0,
        }
    )
    path = run_dir.parent / "cfg.yaml"
    path.write_text(cfg.dump())
    return path


def rank_pid(run_dir: Path) -> int:
    ready = [json.loads(line) for line in (run_dir / "logs/ranks/trainer-rank1.jsonl").read_text().splitlines()]
    return int(next(e["pid"] for e in ready if e["event"] == "rank_ready"))


def test_a_run_whose_rank_dies_mid_epoch_fails_loudly_and_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = run_config(run_dir, epochs=3)
    err = open(tmp_path / "up.err", "w")  # noqa: SIM115 - the child holds it
    up = subprocess.Popen([*CLI, "up", "--config", str(config)], stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        wait_for(run_dir, lambda e: e["event"] == "train_group" and e["epoch"] == 1, timeout=240)
        os.kill(rank_pid(run_dir), signal.SIGKILL)  # mid-epoch 1: v1 is checkpointed, epoch 1 is not done
        t0 = time.monotonic()
        assert up.wait(timeout=120) == 1
        assert time.monotonic() - t0 < 60  # at the trainer's next command, not after a timeout
    finally:
        if up.poll() is None:
            up.kill()
    out = (tmp_path / "up.err").read_text()
    assert "Traceback" not in out
    (line,) = [x for x in out.splitlines() if x.startswith("error: trainer exited (code 1")]  # up's line
    assert "trainer rank group failed" in line and "rank 1 (pid" in line and "signal 9" in line
    crashed = [e for e in read_logs(run_dir) if e["event"] == "actor_crashed"]
    assert [e["actor"] for e in crashed] == ["trainer"]

    resumed = subprocess.run(
        [*CLI, "up", "--resume", "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=400
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == [1, 2, 3]
    check = subprocess.run([*CLI, "replay", str(run_dir), "--check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr


def test_torchrun_style_ranks_join_a_trainer_started_with_rank_variables(tmp_path: Path) -> None:
    """What torchrun does on each host: every rank gets MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK;
    rank 0 (here the test process, as the trainer actor would be) starts no rank itself."""
    from prl_actors.trainer.rank_group import RankEnv

    cfg, model_dir, groups = rollouts(tmp_path)
    cfg = with_trainer(cfg, world_size=2, strategy="ddp")
    env = RankEnv(0, 2, 0, "127.0.0.1", free_port())  # what torchrun's --master-port would be
    config = tmp_path / "cfg.yaml"
    config.write_text(cfg.dump())
    rank1 = {**os.environ, **RankEnv(1, 2, 1, env.master_addr, env.master_port).variables()}
    follower = subprocess.Popen([*CLI, "actor", "trainer", "--config", str(config)], env=rank1)
    saved = dict(os.environ)
    os.environ.update(env.variables())
    try:
        from prl_actors.launch.topology import start_trainer_group

        two = start_trainer_group(cfg, model_dir)
        assert two.procs == []  # torchrun started the ranks, not the trainer
        train_epoch(two, groups)
        two.close()
        assert follower.wait(30) == 0
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if follower.poll() is None:
            follower.kill()
