"""The fork server `up` starts its local actors from (prl_actors/launch/zygote.py): a forked child runs the
CLI with exactly its own environment, in its own session, and its exit (code or signal) reaches `up`;
it stops when the server goes (its supervisor); `up` runs the same either way (run.fork_server)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prl_actors.launch.zygote import CLI, LOST_CODE, Zygote, ZygoteError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def zygote():
    z = Zygote()
    z.wait_ready()
    yield z
    z.close()


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


def test_a_forked_cli_command_exits_with_its_code(zygote: Zygote, tmp_path: Path) -> None:
    ok = zygote.spawn([*CLI, "keys", "create", "--dir", str(tmp_path / "keys"), "worker-7"], _env())
    assert ok.wait(60) == 0
    assert (tmp_path / "keys").is_dir() and any((tmp_path / "keys").iterdir())
    bad = zygote.spawn([*CLI, "actor", "nosuchrole"], _env())
    assert bad.wait(60) not in (0, None)
    # the child's environment is the request's, not the server's: PRL_KEYS names --dir's default
    by_env = zygote.spawn([*CLI, "keys", "create", "worker-9"], _env(PRL_KEYS=str(tmp_path / "from-env")))
    assert by_env.wait(60) == 0
    assert any((tmp_path / "from-env").glob("worker-9*"))


def test_a_child_has_its_own_session_and_dies_by_signal(zygote: Zygote, tmp_path: Path) -> None:
    # `prl-actors actor worker` waits at its start gate (a file that never appears) until its supervisor goes
    gate = tmp_path / "gate"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"run:\n  run_dir: {tmp_path / 'run'}\ntransport:\n  join_timeout_s: 60\n")
    env = _env(PRL_START_GATE=str(gate))
    child = zygote.spawn([*CLI, "actor", "worker", "--config", str(cfg), "--name", "worker-0"], env)
    assert child.poll() is None
    assert os.getpgid(child.pid) == child.pid  # its own process group: `up` signals the group
    child.send_signal(signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.spawn([*CLI, "actor", "worker", "--config", str(cfg), "--name", "worker-1"], env).wait(0.2)


def test_a_forked_process_numbers_its_messages_apart() -> None:
    """Two actors forked from one server must not share message ids (replay matches ids across actors)."""
    from prl_actors.protocol.messages import new_id

    ours = new_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, then out
        os.write(write, new_id().encode())
        os._exit(0)
    os.close(write)
    theirs = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    assert ours.rsplit("-", 1)[0] != theirs.rsplit("-", 1)[0]


def test_only_the_cli_is_forked(zygote: Zygote) -> None:
    with pytest.raises(ZygoteError, match="prl-actors only"):
        zygote.spawn([sys.executable, "-c", "pass"], _env())


def test_children_stop_when_the_server_goes_and_their_end_still_reads(tmp_path: Path) -> None:
    z = Zygote()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"run:\n  run_dir: {tmp_path / 'run'}\ntransport:\n  join_timeout_s: 60\n")
    child = z.spawn(
        [*CLI, "actor", "worker", "--config", str(cfg), "--name", "worker-0"], _env(PRL_START_GATE=str(tmp_path / "g"))
    )
    time.sleep(0.5)
    assert child.poll() is None  # waiting at its gate, its supervisor (the server) alive
    z.proc.kill()  # the server dies: its child notices its parent changed and stops by itself
    z.proc.wait()
    assert child.wait(30) == LOST_CODE  # its real code died with the server
    z.close()


@pytest.mark.e2e  # every `up` here forks; test_proctitle runs `up` without the fork server
def test_up_runs_the_same_with_and_without_the_fork_server(tmp_path: Path) -> None:
    rewards = {}
    for forked in (True, False):
        run = tmp_path / f"run-{forked}"
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "prl_actors.cli.main",
                "up",
                "--config",
                str(ROOT / "configs/demo.yaml"),
                "--run-dir",
                str(run),
            ]
            + ["--epochs", "6", "--set", f"run.fork_server={str(forked).lower()}", "--set", "eval.every_epochs=0"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        rewards[forked] = [r["reward_mean"] for r in rows]
        check = subprocess.run(
            [sys.executable, "-m", "prl_actors.cli.main", "replay", str(run), "--check"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert check.returncode == 0, check.stdout + check.stderr  # message ids of forked actors stay apart
    assert rewards[True] == rewards[False] and len(rewards[True]) == 6
