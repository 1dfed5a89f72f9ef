"""Self-healing (issue 23 item 7), with real processes and tcp sockets: a core actor SIGKILLed mid-run
makes `up` restart the core (coordinator, publisher, buffer, trainer) from the last checkpoint, the
worker processes stay up and rejoin, the run completes every epoch and `replay --check` is green;
the restarts are bounded (run.max_restarts), and 0 ends the run as before."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from prl_actors.config import Config
from prl_actors.records.rundir import RunDir
from prl_actors.replay.checks import run_checks
from prl_actors.replay.events import load_run
from tests.conftest import read_logs, sim_config, wait_for
from tests.test_supervision import actor_pids, ended, kill_all, start_up

pytestmark = pytest.mark.integration
EPOCHS = 5
CORE = ("coordinator", "publisher", "buffer", "trainer")


def heal_config(run_dir: Path, **overrides: object) -> Config:
    settings: dict[str, object] = {"run__epochs": EPOCHS, "sim__gen_s_per_token": 0.01, **overrides}
    return sim_config(run_dir, transport="tcp", **settings)


def kill_when_open(run_dir: Path, victim: str, epoch: int, core: int = 1) -> int:
    """SIGKILL `victim` (its newest process) once the `core`-th coordinator (1: the first, 2: the
    one of the first restart ...) opened `epoch`."""

    def opened(e: dict) -> bool:
        if e["event"] != "epoch_open" or e["actor"] != "coordinator" or e["epoch"] != epoch:
            return False
        starts = [
            s["t_mono"] for s in read_logs(run_dir) if s["event"] == "actor_start" and s["actor"] == "coordinator"
        ]
        return len(starts) >= core and e["t_mono"] > starts[core - 1]

    wait_for(run_dir, opened, 90)
    pid = int(actor_pids(run_dir)[victim])
    os.kill(pid, signal.SIGKILL)
    return pid


def assert_healed(run_dir: Path, err: str, victim: str) -> None:
    """Every epoch once in the surviving line, the workers never restarted, replay --check green."""
    assert f"{victim} exited (signal 9); restarting from v" in err and "(restart 1 of 3)" in err, err
    assert "up: the core is back: epoch" in err and "Traceback" not in err, err
    assert RunDir(run_dir).latest_checkpoint() == run_dir / "checkpoints" / f"v{EPOCHS}"
    events = read_logs(run_dir)
    starts = [e["actor"] for e in events if e["event"] == "actor_start"]
    assert sorted(starts) == sorted(["coordinator", "publisher", "buffer", "trainer"] * 2 + ["worker-0", "worker-1"])
    assert {e["actor"] for e in events if e["event"] == "core_restarted"} == {"worker-0", "worker-1"}
    done = [e for e in events if e["event"] == "run_done"]
    assert [d["reason"] for d in done] == ["completed"]
    failed = [(r.name, r.violations[:3]) for r in run_checks(load_run(run_dir)) if not r.ok]
    assert not failed, failed


@pytest.mark.e2e  # a trainer killed and restarted through `up`, every row kept: test_record_whole[before]
def test_a_killed_trainer_is_restarted_in_place_and_the_run_completes(tmp_path: Path, run_dir: Path) -> None:
    proc = start_up(heal_config(run_dir), tmp_path)
    pids: list[int] = []
    try:
        kill_when_open(run_dir, "trainer", epoch=2)
        code, err = ended(proc, 120.0)
        pids = list(actor_pids(run_dir).values())
        assert code == 0, err
        assert_healed(run_dir, err, "trainer")
        assert re.search(r"restarting from v[12] \(restart 1 of 3\)", err), err  # at most one epoch lost
    finally:
        proc.kill()
        kill_all(pids)


@pytest.mark.slow  # ~20 s on 2 cores: a second core start
@pytest.mark.parametrize("victim", ["coordinator", "buffer", "publisher"])
def test_a_killed_core_actor_is_restarted_in_place_and_the_run_completes(
    tmp_path: Path, run_dir: Path, victim: str
) -> None:
    proc = start_up(heal_config(run_dir), tmp_path)
    pids: list[int] = []
    try:
        kill_when_open(run_dir, victim, epoch=2)
        code, err = ended(proc, 120.0)
        pids = list(actor_pids(run_dir).values())
        assert code == 0, err
        assert_healed(run_dir, err, victim)
    finally:
        proc.kill()
        kill_all(pids)


@pytest.mark.slow  # two restarts
def test_restarts_are_bounded_by_max_restarts(tmp_path: Path, run_dir: Path) -> None:
    proc = start_up(heal_config(run_dir, run__epochs=50, run__max_restarts=1), tmp_path)
    pids: list[int] = []
    try:
        kill_when_open(run_dir, "trainer", epoch=1)
        kill_when_open(run_dir, "trainer", epoch=3, core=2)
        code, err = ended(proc, 60.0)
        pids = list(actor_pids(run_dir).values())
        assert code == 1, err
        assert "trainer exited (signal 9); restarting from v" in err and "(restart 1 of 1)" in err
        assert (
            "error: trainer exited (signal 9); see " in err
            and "not restarted: the core was restarted 1 times (run.max_restarts)" in err
        ), err
        assert "Traceback" not in err
    finally:
        proc.kill()
        kill_all(pids)


def test_max_restarts_0_ends_the_run_as_before(tmp_path: Path, run_dir: Path) -> None:
    proc = start_up(heal_config(run_dir, run__epochs=200, run__max_restarts=0), tmp_path)
    pids: list[int] = []
    try:
        kill_when_open(run_dir, "trainer", epoch=1)
        code, err = ended(proc, 30.0)
        pids = list(actor_pids(run_dir).values())
        assert code == 1 and "error: trainer exited (signal 9); see " in err, err
        assert "restarting" not in err and "not restarted" not in err
    finally:
        proc.kill()
        kill_all(pids)


@pytest.mark.slow  # ~20 s on 2 cores: a second core start
def test_a_restart_behind_the_workers_weights_makes_them_fetch_the_older_checkpoint(
    tmp_path: Path, run_dir: Path
) -> None:
    """trainer.checkpoint_every 2: killed in epoch 3, the core goes back to v2 while the workers hold
    v3 of the dead core (never made again: the same number, other weights). They fetch v2 anyway;
    epochs 2 and 3 are redone, every group trained is of its epoch's version of the surviving line."""
    proc = start_up(heal_config(run_dir, trainer__checkpoint_every=2), tmp_path)
    pids: list[int] = []
    try:
        kill_when_open(run_dir, "trainer", epoch=3)
        code, err = ended(proc, 120.0)
        pids = list(actor_pids(run_dir).values())
        assert code == 0, err
        assert "trainer exited (signal 9); restarting from v2 (restart 1 of 3)" in err, err
        held = [e["held"] for e in read_logs(run_dir) if e["event"] == "core_restarted"]
        assert held == [3, 3], held  # both workers held the dead core's v3
        assert [r["epoch"] for r in RunDir(run_dir).metrics_rows()] == list(range(EPOCHS))
        failed = [(r.name, r.violations[:3]) for r in run_checks(load_run(run_dir)) if not r.ok]
        assert not failed, failed
    finally:
        proc.kill()
        kill_all(pids)


def processes_with(text: str) -> list[int]:
    """Pids of live processes whose command line (a process title included) holds `text`."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                out.append(int(proc.name))
        except OSError:
            continue
    return out


@pytest.mark.slow  # ~20 s on 2 cores: a spare core imports beside the run
def test_a_spare_core_takes_over_and_none_outlives_the_run(tmp_path: Path, run_dir: Path) -> None:
    """run.standby_core: the spares wait without a word in the logs (one actor_start per process
    that ran), take over after the coordinator's crash, a new spare waits for the next one, and
    every spare is stopped with the run."""
    name = f"heal-{tmp_path.name}"  # every process of the run carries it in its title (launch/proctitle.py)
    proc = start_up(heal_config(run_dir, run__epochs=8, run__standby_core=True, run__name=name), tmp_path)
    pids: list[int] = []
    try:
        kill_when_open(run_dir, "coordinator", epoch=4)  # the spares have long imported by then
        code, err = ended(proc, 120.0)
        pids = list(actor_pids(run_dir).values())
        assert code == 0, err
        assert "coordinator exited (signal 9); restarting from v" in err, err
        starts = [e["actor"] for e in read_logs(run_dir) if e["event"] == "actor_start"]
        assert sorted(starts) == sorted([*CORE, *CORE, "worker-0", "worker-1"])
        failed = [(r.name, r.violations[:3]) for r in run_checks(load_run(run_dir)) if not r.ok]
        assert not failed, failed
        assert processes_with(f"(run {name})") == []  # no spare left behind
    finally:
        proc.kill()
        kill_all(pids)
