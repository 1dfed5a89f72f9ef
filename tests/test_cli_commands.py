"""The CLI's surface (issue 40, item 6): -h and --version, readable labels, one way to name a run
(positional RUN_DIR) for status / scale / stop / health / replay / export, each saying which run it
acts on; finished runs are no longer offered as live; one export command."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prl_actors.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def run_cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_short_help_and_version() -> None:
    code, out = run_cli("-h")
    assert code == 0 and "Usage: prl-actors" in out
    code, out = run_cli("up", "-h")
    assert code == 0 and "--dry-run" in out
    done = subprocess.run(
        [sys.executable, "-m", "prl_actors.cli.main", "--version"], capture_output=True, text=True, timeout=10
    )
    assert done.returncode == 0 and done.stdout.startswith("prl-actors ")


@pytest.mark.parametrize("command", ["up", "status", "scale", "stop", "replay", "export", "bench", "actor"])
def test_help_labels_are_readable(command: str) -> None:
    code, out = run_cli(command, "-h")
    assert code == 0
    for odd in ("<bool>", "<int", "<list[", "<float"):  # an argument keeps typer's <path> / <str>
        assert odd not in out, f"{command} -h shows {odd}"


def test_up_help_labels_and_choices() -> None:
    flat = " ".join(run_cli("up", "-h")[1].split())
    assert "--workers N" in flat and "--set KEY=VALUE" in flat and "-c, --config PATH" in flat
    assert "--mode periodic|sync|bounded" in flat


@pytest.mark.parametrize("command", ["status", "stop", "health", "replay", "export"])
def test_every_run_command_takes_the_run_dir_positionally(command: str) -> None:
    code, out = run_cli(command, "-h")
    assert code == 0 and "RUN_DIR" in out.splitlines()[0]


@pytest.mark.parametrize("command", [["status"], ["stop"], ["scale", "--workers", "2"], ["health"]])
def test_a_dir_that_is_no_run_is_one_clear_line(tmp_path: Path, command: list[str]) -> None:
    code, out = run_cli(*command, str(tmp_path))
    assert code == 2 and "not a run directory" in out and str(tmp_path) in out


def test_run_dir_and_config_together_are_refused(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("run: {}\n")
    code, out = run_cli("status", str(tmp_path), "--config", str(tmp_path / "config.yaml"))
    assert code == 2 and "not both" in out


def test_status_scale_stop_name_the_run_they_act_on(tmp_path: Path) -> None:
    """A live sim run named by its directory: every command's output names it."""
    from prl_actors.launch.process import LocalCluster
    from prl_actors.records.rundir import RunDir
    from tests.conftest import sim_config

    run_dir = tmp_path / "exp1"
    cfg = sim_config(run_dir, transport="tcp", run__epochs=1000, sim__gen_s_per_token=0.01)
    rd = RunDir(run_dir)
    with rd.lock():
        rd.config.write_text(cfg.dump())
        cluster = LocalCluster(cfg, workers=1, log_dir=run_dir / "logs")
        try:
            deadline = time.monotonic() + 30.0
            while True:
                code, out = run_cli("status", str(run_dir))
                assert code == 0, out
                if "worker-0" in out or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert out.splitlines()[0] == f"run: {run_dir} (given)"
            code, out = run_cli("scale", str(run_dir), "--workers", "1")
            assert code == 0 and f"asked run {run_dir} (given) for 1 workers" in out
            code, out = run_cli("stop", str(run_dir))
            assert code == 0 and f"stop requested of run {run_dir} (given)" in out
        finally:
            cluster.close()


def test_finished_runs_are_not_offered_as_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`up` unregisters its run when it ends; a run left in the registry (up killed) is called not running."""
    from prl_actors.records.rundir import register_run, registered_runs, unregister_run

    monkeypatch.setenv("PRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    done, killed = tmp_path / "done", tmp_path / "killed"
    for d in (done, killed):
        d.mkdir()
        (d / "config.yaml").write_text("run: {}\n")
        register_run(d)
    unregister_run(done)
    assert registered_runs() == [killed.resolve()]
    code, out = run_cli("status")
    assert code == 1 and f"{killed.resolve()} (not running)" in out and str(done) + " " not in out


def test_one_export_command_with_the_old_name_hidden(tmp_path: Path) -> None:
    code, out = run_cli("-h")
    assert " export " in out and "export-merged" not in out
    for name in ("export", "export-merged"):
        code, out = run_cli(name, str(tmp_path), "--out", str(tmp_path / "out"))
        assert code == 2 and "holds no checkpoints/" in out
    code, out = run_cli("export", "-h")
    assert "--base" in out and "--adapter" in out


def test_export_takes_a_run_dir_or_one_checkpoint(tmp_path: Path) -> None:
    """A run directory holds a model/ of its own (what the actors loaded): it is still a run
    directory, whose newest checkpoint is exported; a checkpoint directory is taken as is."""
    from prl_actors.cli.export_cmd import checkpoint_to_export

    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text("{}")
    for v in (1, 2):
        ckpt = run / "checkpoints" / f"v{v}"
        (ckpt / "model").mkdir(parents=True)
        (ckpt / "model" / "config.json").write_text("{}")
        (ckpt / "DONE").write_text(str(v))  # a marker without checksums: trusted
    assert checkpoint_to_export(run, None) == run / "checkpoints" / "v2"
    assert checkpoint_to_export(run, 1) == run / "checkpoints" / "v1"
    assert checkpoint_to_export(run / "checkpoints" / "v1", None) == run / "checkpoints" / "v1"


def test_status_of_a_run_that_has_ended_says_so(tmp_path: Path) -> None:
    from tests.conftest import port_base, sim_config

    run_dir = tmp_path / "done"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(sim_config(run_dir, transport="tcp", transport__base_port=port_base()).dump())
    (run_dir / "metrics.jsonl").write_text('{"epoch": 0}\n{"epoch": 1}\n{"epoch": 1, "eval": true}\n')
    code, out = run_cli("status", str(run_dir))
    assert code == 1 and f"runs {run_dir}: it has ended (2 epochs in metrics.jsonl" in out, out


def test_up_drops_its_run_from_the_registry_when_it_ends(tmp_path: Path) -> None:
    import os

    from tests.conftest import sim_config

    env = {**os.environ, "PRL_CACHE_DIR": str(tmp_path / "cache")}
    run_dir = tmp_path / "run"
    (tmp_path / "cfg.yaml").write_text(sim_config(run_dir, transport="tcp", run__epochs=1).dump())
    argv = [sys.executable, "-m", "prl_actors.cli.main", "up", "--config", str(tmp_path / "cfg.yaml")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run_dir / "config.yaml").is_file()  # it ran, and was registered while it did (`register_run`)
    assert list((tmp_path / "cache" / "runs").glob("*.json")) == []
