"""The one supervisor (prl_actors/launch/supervisor.py) with real processes: process groups, the stop
ladder (grace, SIGTERM, SIGKILL), stop signals, restart back-off; the env runtime as its plug-in;
the run-dir lock for every kind of `up`."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prl_actors.cli.main import app
from prl_actors.launch.classic import EnvRun
from prl_actors.launch.supervisor import RESTART_BACKOFF_S, Interrupted, Signals, Supervisor, restart_delay
from prl_actors.launch.wiring import OnExit, members
from prl_actors.records.rundir import RunDir
from prl_actors.runtime.processes import SUPERVISOR_ENV, spawn, stop_children, wait_exit
from tests.conftest import sim_config
from tests.env_utils import env_config

ROOT = Path(__file__).resolve().parent.parent
IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def started(child_out: Path) -> None:
    """Until the child printed its first line (its handlers are installed)."""
    deadline = time.monotonic() + 20.0
    while not (child_out.exists() and child_out.read_text().strip()):
        assert time.monotonic() < deadline, "the child did not start"
        time.sleep(0.02)


def test_a_child_runs_in_its_own_group_and_knows_its_supervisor(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = f"import os; open({str(out)!r}, 'w').write(str(os.getpgid(0)) + ' ' + os.environ[{SUPERVISOR_ENV!r}])"
    child = spawn("a", python(code))
    assert wait_exit([child], 20.0) and child.proc.returncode == 0
    group, supervisor = out.read_text().split()
    assert int(group) == child.pid != os.getpgid(0)
    assert int(supervisor) == os.getpid()


def test_reap_ends_a_child_that_ignores_sigterm_and_its_subprocess(tmp_path: Path) -> None:
    """Grace, then SIGTERM to the group (ignored here), then SIGKILL: nothing survives, not even the
    child's own subprocess (an engine), and every wait is bounded."""
    out = tmp_path / "out"
    grandchild = (
        f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {IGNORES_SIGTERM!r}]); "
        + IGNORES_SIGTERM.replace("print('up', flush=True)", f"open({str(out)!r}, 'w').write(str(p.pid))")
    )
    sup = Supervisor(grace_s=0.3)
    child = sup.start(spawn("stuck", python(grandchild)))
    started(out)
    time.sleep(0.3)  # the grandchild has started too (it ignores SIGTERM as well)
    t0 = time.monotonic()
    sup.reap()
    waited = time.monotonic() - t0
    assert child.proc.returncode == -signal.SIGKILL
    assert 0.3 <= waited < 0.3 + 2 * 2.0 + 3.0, waited
    pid, deadline = int(out.read_text()), time.monotonic() + 2.0
    while running(pid) and time.monotonic() < deadline:  # SIGKILLed with its parent, a moment ago
        time.sleep(0.02)
    assert not running(pid)  # its subprocess too (the whole group)


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_reap_leaves_a_clean_exit_alone_within_the_grace_period() -> None:
    sup = Supervisor(grace_s=10.0)
    child = sup.start(spawn("quick", python("import time; time.sleep(0.3)")))
    sup.reap()
    assert child.proc.returncode == 0  # it was not signalled


def test_a_retired_member_is_signalled_and_still_reaped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sup = Supervisor(grace_s=0.2)
    child = sup.start(spawn("w", python(IGNORES_SIGTERM), output=out.open("wb")))
    started(out)
    sup.retire("w")
    assert "w" not in sup.children and child.alive()  # it ignored the SIGTERM
    sup.reap()
    assert child.proc.returncode == -signal.SIGKILL


def test_a_child_in_our_group_is_stopped_alone(tmp_path: Path) -> None:
    """A trainer rank shares rank 0's group: stopping it must not signal this process."""
    out = tmp_path / "out"
    child = spawn("rank1", python(IGNORES_SIGTERM), output=out.open("wb"), own_group=False)
    started(out)
    assert os.getpgid(child.pid) == os.getpgid(0)
    stop_children([child], 0.1)
    assert child.proc.returncode == -signal.SIGKILL


def test_the_first_signal_asks_a_stop_and_a_second_hurries() -> None:
    signals = Signals()
    before = signal.getsignal(signal.SIGHUP)
    with signals.installed():
        signals.check()  # nothing yet
        os.kill(os.getpid(), signal.SIGHUP)
        with pytest.raises(Interrupted) as caught:
            signals.check()
        assert caught.value.signum == signal.SIGHUP and not signals.hurry
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.hurry and signals.signum == signal.SIGHUP
        assert Supervisor(5.0, signals).grace() == 0.0  # no more grace periods
    assert signal.getsignal(signal.SIGHUP) is before  # restored


def test_an_immediate_signal_cuts_a_blocking_call_short() -> None:
    with Signals(immediate=True).installed(), pytest.raises(Interrupted):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10.0)


def test_restart_back_off_doubles() -> None:
    b = RESTART_BACKOFF_S
    assert [restart_delay(n) for n in range(4)] == [0.0, b, 2 * b, 4 * b]


# --- the env runtime as a plug-in -------------------------------------------------------------


class ScriptedEnvRun(EnvRun):
    """The env runtime's policy with scripted processes: the learner exits 7 after `learner_s`;
    env-0 crashes at once, later env actors run until stopped."""

    learner_s = 1.5

    def spawn(self, name: str) -> None:
        if name == "learner":
            argv = python(f"import time; time.sleep({self.learner_s}); raise SystemExit(7)")
        else:
            argv = python("raise SystemExit(1)" if name == "env-0" else "import time; time.sleep(60)")
        self.sup.start(spawn(name, argv))


def test_the_env_runtime_replaces_a_crashed_env_actor_and_ends_with_the_learner(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = env_config(tmp_path / "run", actors=2)
    assert [m.name for m in members(cfg)] == ["learner", "env-0", "env-1"]
    run = ScriptedEnvRun(cfg, tmp_path / "config.yaml")
    assert run.run() == 7  # the learner's exit code
    assert "env-0 exited (code 1); started env-2" in capsys.readouterr().err
    assert all(not c.alive() for c in run.sup.all())  # env-1 and env-2 were reaped


def test_a_signal_to_the_env_runtime_stops_the_learner_and_reaps_all(tmp_path: Path) -> None:
    cfg = env_config(tmp_path / "run", actors=1)
    run = ScriptedEnvRun(cfg, tmp_path / "config.yaml")
    run.learner_s = 60.0
    run.sup.grace_s = 0.5
    signal.setitimer(signal.ITIMER_REAL, 0.5)  # SIGALRM is not a stop signal: send SIGTERM from it
    previous = signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    try:
        t0 = time.monotonic()
        assert run.run() == 128 + signal.SIGTERM
        assert time.monotonic() - t0 < 20.0
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert all(not c.alive() for c in run.sup.all())


def test_env_up_holds_the_run_dir_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second `up` on a run dir some `up` holds fails at once, for a classic-RL config as for GRPO
    (without the lock it went on and met the first run's ports)."""
    monkeypatch.setenv("PRL_CACHE_DIR", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with RunDir(run_dir).lock():
            argv = ["up", "--config", str(ROOT / "configs" / "cartpole.yaml"), "--run-dir", str(run_dir)]
            argv += ["--set", f"transport.base_port={port}"]  # busy: without the lock, `up` stops at its ports
            result = CliRunner().invoke(app, argv)
    assert result.exit_code != 0
    assert f"run dir {run_dir} is in use by a running `prl-actors up`" in " ".join(result.output.split())


def test_the_composition_root_names_every_member_in_start_order(tmp_path: Path) -> None:
    plan = members(sim_config(tmp_path, run__workers=2))
    assert [(m.name, m.tier) for m in plan] == [
        ("trainer", 0), ("worker-0", 0), ("worker-1", 0), ("coordinator", 1), ("publisher", 2), ("buffer", 2),
    ]  # fmt: skip
    assert [m.name for m in plan if m.gated] == ["trainer", "worker-0", "worker-1"]
    assert [m.name for m in plan if m.on_exit is OnExit.ENDS_RUN] == ["coordinator"]
    assert {m.name for m in plan if m.binds} == {"coordinator", "publisher", "buffer"}


def test_a_child_whose_supervisor_is_killed_outright_notices(tmp_path: Path) -> None:
    """watch_supervisor (the env learner, the trainer ranks): the supervisor SIGKILLed, the child's
    callback runs within a poll or two."""
    out = tmp_path / "out"
    grandchild = (
        "import os, time; from prl_actors.runtime.processes import watch_supervisor; "
        f"watch_supervisor(lambda: (open({str(out)!r}, 'w').write('gone'), os._exit(0)), poll_s=0.05); "
        "time.sleep(30)"
    )
    supervisor = (
        f"import os, subprocess, sys, time; env = {{**os.environ, {SUPERVISOR_ENV!r}: str(os.getpid())}}; "
        f"subprocess.Popen([sys.executable, '-c', {grandchild!r}], env=env); "
        "time.sleep(60)"
    )
    sup = spawn("sup", python(supervisor), {"PYTHONPATH": str(ROOT)})
    time.sleep(1.0)  # the grandchild is up and watching
    assert not out.exists()
    sup.proc.kill()
    sup.proc.wait()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and not (out.exists() and out.read_text() == "gone"):
        time.sleep(0.05)  # the file exists from open() on: wait for what the callback wrote, not only for it
    assert out.read_text() == "gone"


# --- compose: the supervisor's signal handling around containers ------------------------------


def test_compose_up_a_signal_cuts_a_blocking_step_short_and_a_second_one_does_not_escape(tmp_path: Path) -> None:
    """`up --compose`: a stop signal interrupts the image build at once; a second one while the
    coordinator is asked to stop ends that wait, never a traceback; teardown always runs."""
    from prl_actors.config import load_config
    from prl_actors.launch.compose import ComposeRun

    done: list[str] = []

    class Scripted(ComposeRun):
        def build(self) -> None:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            time.sleep(30.0)  # a long image build
            done.append("built")

        def stop_run(self, reason: str) -> None:
            done.append(reason)
            os.kill(os.getpid(), signal.SIGHUP)  # impatient: a second signal
            time.sleep(30.0)

        def teardown(self) -> None:
            done.append("teardown")

    run = Scripted(["docker-compose"], load_config(None, {}), tmp_path / "c.yml", tmp_path / "s", 27500)
    previous = signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    try:
        t0 = time.monotonic()
        assert run.run() == 128 + signal.SIGTERM
        assert time.monotonic() - t0 < 10.0
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert done == ["SIGTERM to prl-actors up --compose", "teardown"]
