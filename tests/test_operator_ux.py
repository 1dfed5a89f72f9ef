"""Issue 23 (items 1b, 8): keys that cannot be exported by mistake, and the operator's commands as a
user meets them: run discovery, --set values, typo hints, resume limits, timeline cropping."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prl_actors.cli.main import app
from prl_actors.transport.auth import KeysError, create_keys, export_keys, run_key_names

runner = CliRunner()


def run_cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.output


# --- 1b: keys ------------------------------------------------------------------------------------


def test_export_of_a_name_never_created_is_an_error(tmp_path: Path) -> None:
    keys = tmp_path / "run" / "keys"
    create_keys(keys, run_key_names())
    code, out = run_cli("keys", "export", "worker-gpu1", "--out", str(tmp_path / "b"), "--run-dir", str(keys.parent))
    assert code == 2
    assert "no key named 'worker-gpu1'" in out and "keys create worker-gpu1" in out
    assert not (tmp_path / "b").exists()  # nothing written, least of all worker.key_secret


def test_no_bundle_carries_a_role_key_that_acts_as_every_member(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    create_keys(keys, [*run_key_names(), "worker-gpu1"])
    for shared in ("worker", "env"):
        with pytest.raises(KeysError, match="every"):
            export_keys(keys, shared, tmp_path / shared)
    files = export_keys(keys, "worker-gpu1", tmp_path / "b")
    assert [f for f in files if f.endswith(".key_secret")] == ["worker-gpu1.key_secret"]
    assert export_keys(keys, "operator", tmp_path / "op")[0] == "operator.key_secret"  # one operator: fine


# --- 8: finding the live run --------------------------------------------------------------------


def test_status_finds_the_newest_live_run_whatever_its_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run in tmp/elsewhere/demo (not runs/latest), registered by `up` and locked as `up` locks it:
    `status` without --config reaches it; with no live run the error names the --config to pass."""
    from prl_actors.launch.process import LocalCluster
    from prl_actors.records.rundir import RunDir, register_run
    from tests.conftest import sim_config

    monkeypatch.setenv("PRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # no runs/latest here
    run_dir = tmp_path / "elsewhere" / "demo"
    cfg = sim_config(run_dir, transport="tcp", run__epochs=1000, sim__gen_s_per_token=0.01)
    rd = RunDir(run_dir)
    with rd.lock():
        rd.config.write_text(cfg.dump())
        register_run(run_dir)
        cluster = LocalCluster(cfg, workers=1, log_dir=run_dir / "logs")
        try:
            deadline = time.monotonic() + 30.0  # the worker registers a moment after the cluster is up
            while True:
                code, out = run_cli("status")
                assert code == 0, out
                if "worker-0" in out or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert "state" in out and "worker-0" in out
        finally:
            cluster.close()
    code, out = run_cli("status")  # `up` is gone (the lock is free): nothing live to reach
    assert code == 1
    assert f"--config {run_dir.resolve() / 'config.yaml'}" in out, out


# --- 8: config values and typos -------------------------------------------------------------------


def test_set_keeps_a_string_fields_value_as_written() -> None:
    from prl_actors.config import load_config, parse_override

    prompt = "Think step by step. End with #### N: Answer: give a number"
    cfg = load_config(
        None, dict([parse_override(f"task.system_prompt={prompt}"), parse_override("task.chat_template=true")])
    )
    assert cfg.task.system_prompt == prompt
    assert parse_override("trainer.lr=0.5") == ("trainer.lr", 0.5)  # other fields: YAML as before
    assert parse_override("task.system_prompt=null") == ("task.system_prompt", None)


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("trainer.lrr=1", "did you mean trainer.lr?"),
        ("worker.group_sise=4", "did you mean worker.group_size?"),
        ("trainr.lr=1", "did you mean trainer?"),
    ],
)
def test_a_config_typo_suggests_the_nearest_field(override: str, hint: str) -> None:
    code, out = run_cli("up", "--set", override)
    assert code == 2 and hint in out, out


# --- 8: resume limits ------------------------------------------------------------------------------


def finished_run(run_dir: Path, version: int) -> bytes:
    """A run directory as `up` leaves it after `version` epochs (config, metrics, checkpoint vN)."""
    from prl_actors.records.rundir import RunDir
    from tests.conftest import sim_config

    rd = RunDir(run_dir)
    run_dir.mkdir(parents=True)
    rd.config.write_text(sim_config(run_dir, transport="tcp", run__epochs=version).dump())
    rd.metrics.write_text("".join(f'{{"epoch": {e}, "version": {e + 1}}}\n' for e in range(version)))
    (rd.checkpoints / f"v{version}").mkdir(parents=True)
    (rd.checkpoints / f"v{version}" / "DONE").write_text(str(version))
    return rd.config.read_bytes()


def test_resume_of_a_finished_run_says_so_at_once(tmp_path: Path) -> None:
    import time

    stored = finished_run(tmp_path / "run", 3)
    t0 = time.monotonic()
    code, out = run_cli("up", "--resume", "--run-dir", str(tmp_path / "run"))
    assert code == 0 and "is finished, 3 of 3 epochs done (v3)" in out, out
    assert time.monotonic() - t0 < 5.0  # no actor started
    assert not (tmp_path / "run" / "logs").exists()
    assert (tmp_path / "run" / "config.yaml").read_bytes() == stored


def test_epochs_below_what_is_done_are_refused(tmp_path: Path) -> None:
    stored = finished_run(tmp_path / "run", 3)
    code, out = run_cli("up", "--resume", "--run-dir", str(tmp_path / "run"), "--epochs", "2")
    assert code == 2 and "--epochs 2 is below the 3 epochs" in out, out
    assert (tmp_path / "run" / "config.yaml").read_bytes() == stored  # not rewritten


# --- 8: the timeline of a resumed run ---------------------------------------------------------------


def resumed_logs(run_dir: Path) -> None:
    """Coordinator logs of 40 epochs of 0.1 s, a 111 s stop, then 40 more (as a resumed run logs)."""
    import json

    def line(t: float, event: str, **fields: object) -> str:
        return json.dumps({"t_mono": t, "actor": "coordinator", "role": "coordinator", "event": event, **fields})

    lines = [line(0.0, "actor_start")]
    for e in range(80):
        t = 1.0 + 0.1 * e + (111.0 if e >= 40 else 0.0)
        lines += [line(t, "epoch_open", epoch=e, version=e), line(t + 0.09, "epoch_done", done_epoch=e)]
    lines.append(line(1.0 + 111.0 + 8.0, "run_done", reason="completed"))
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "coordinator.jsonl").write_text("\n".join(lines) + "\n")


def test_the_timeline_folds_gaps_and_crops_to_epochs(tmp_path: Path) -> None:
    from prl_actors.replay.axis import time_axis
    from prl_actors.replay.events import load_run

    resumed_logs(tmp_path / "run")
    run = load_run(tmp_path / "run")
    whole = time_axis(run, [])
    assert [round(b - a) for a, b in whole.gaps] == [111]
    first_40 = whole.x(1.0 + 3.9) - whole.x(1.0)  # epoch 0 opens to epoch 39 opens
    assert first_40 > 0.3 * whole.width  # not a sliver (drawn to scale: 4 s of 120 s)
    assert first_40 == pytest.approx(3.9)  # kept stretches stay to scale
    later = time_axis(run, [], (40, 49))
    assert later.lo == pytest.approx(112.0 + 4.0) and later.width == pytest.approx(1.0)
    png = tmp_path / "t.png"
    code, out = run_cli("replay", str(tmp_path / "run"), "--timeline", str(png), "--epochs", "40:49")
    assert code == 0 and png.stat().st_size > 0, out
    code, out = run_cli("replay", str(tmp_path / "run"), "--timeline", str(png), "--epochs", "90:95")
    assert code == 2 and "no such epoch" in out


# --- 8: shipped configs pick free ports --------------------------------------------------------------


CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_do_not_hard_code_ports(path: Path) -> None:
    """Two runs of the same shipped config must not collide: no fixed base port."""
    from prl_actors.config import load_config

    cfg = load_config(path)
    assert cfg.transport.base_port is None, path


def test_free_ports_cover_the_learner_of_a_classic_rl_run() -> None:
    """A classic-RL run binds base + 5 (the learner): a set whose +5 is taken is skipped."""
    import socket

    from prl_actors.config import load_config
    from prl_actors.launch.up import pick_ports

    first = load_config(CONFIGS / "cartpole.yaml")
    pick_ports(first)
    assert first.transport.base_port is not None
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", first.transport.base_port + 5))
        s.listen()
        second = load_config(CONFIGS / "cartpole.yaml")
        pick_ports(second)
        assert second.transport.base_port != first.transport.base_port


# --- 8: a joined worker says what it does ------------------------------------------------------------


def test_a_joined_worker_says_what_it_is_doing(run_dir: Path) -> None:
    """The console lines of `prl-actors actor worker` (started by hand) from a real worker's log."""
    import threading

    from prl_actors.cli.narrate import follow_log
    from prl_actors.launch.process import LocalCluster
    from tests.conftest import sim_config

    lines: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=follow_log, args=(run_dir / "logs" / "worker-0.jsonl", "worker-0", stop, lines.append)
    )
    thread.start()
    cluster = LocalCluster(sim_config(run_dir, run__epochs=3), workers=1, log_dir=run_dir / "logs")
    try:
        assert cluster.wait(60)
        # the coordinator's Shutdown reaches the worker after the coordinator is done: the worker stops
        # on it (and says so); closing the cluster first would stop it before it heard
        assert cluster.hosts["worker-0"].done.wait(10)
    finally:
        cluster.close()
        stop.set()
        thread.join(5)
    text = "\n".join(lines)
    assert lines[0].startswith("worker-0: joined run"), text
    assert "worker-0: loaded weights v0" in text and "worker-0: loaded weights v2" in text
    epochs = [line for line in lines if ": epoch " in line]
    assert [line.split(":")[1] for line in epochs] == [" epoch 0", " epoch 1", " epoch 2"], text
    assert all(line.endswith("generated and sent 6 groups") for line in epochs), text
    assert lines[-1].startswith("worker-0: stopped:"), text


# --- 9: a fast start that says what it waits for ------------------------------------------------------


def test_the_start_gate_waits_for_the_servers_and_gives_up_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer and workers that `up` starts early wait for the gate file, at most
    transport.join_timeout_s, and then fail with one line (never a silent hang)."""
    import threading
    import time

    from prl_actors.launch.process import START_GATE_ENV, start_gate
    from tests.conftest import sim_config

    cfg = sim_config(tmp_path / "run", transport__join_timeout_s=0.5)
    assert start_gate(cfg) is None  # an actor started on its own does not wait
    monkeypatch.setenv(START_GATE_ENV, str(tmp_path / "gate"))
    wait = start_gate(cfg)
    assert wait is not None
    with pytest.raises(RuntimeError, match="servers were not up within 0.5s"):
        wait()
    threading.Timer(0.2, (tmp_path / "gate").touch).start()
    t0 = time.monotonic()
    wait()  # opens when the file appears
    assert 0.15 < time.monotonic() - t0 < 0.5


def test_up_says_what_it_starts(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.conftest import sim_config

    cfg = sim_config(
        tmp_path / "run", transport="tcp", transport__base_port=None, run__epochs=3, sim__gen_s_per_token=0.02
    )
    (tmp_path / "cfg.yaml").write_text(cfg.dump())
    env = {**os.environ, "PRL_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-m", "prl_actors.cli.main", "up", "--config", str(tmp_path / "cfg.yaml")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    for line in ("up: coordinator ready (", "up: publisher, buffer ready (", "up: every actor joined ("):
        assert line in out.stderr, out.stderr


def test_keys_commands_default_to_the_live_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prl_actors.records.rundir import RunDir, register_run

    monkeypatch.setenv("PRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / "demo"
    rd = RunDir(run_dir)
    with rd.lock():
        rd.config.write_text("{}\n")
        register_run(run_dir)
        create_keys(run_dir / "keys", run_key_names())
        code, out = run_cli("keys", "create", "worker-gpu1")
        assert code == 0 and str(run_dir.resolve() / "keys") in out, out
        code, out = run_cli("keys", "export", "worker-gpu1", "--out", str(tmp_path / "b"))
        assert code == 0 and (tmp_path / "b" / "worker-gpu1.key_secret").exists(), out
