"""Resume is the run it resumes: `up --resume` reads RUN_DIR/config.yaml, changes only safe fields,
refuses the rest with one line naming them, and never rewrites config.yaml with other training
fields; one `up` per run dir. Fast tier: every case here is refused before any actor starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prl_actors.cli.main import app
from prl_actors.config import check_resume, load_config, safe_on_resume
from prl_actors.records.rundir import RunDir
from prl_actors.sections import ConfigError
from tests.conftest import sim_config

runner = CliRunner()


def a_run(run_dir: Path, checkpoint: bool = True) -> bytes:
    """A run directory as `up` leaves it (config, a metrics row, a checkpoint); config.yaml's bytes."""
    cfg = sim_config(run_dir, transport="tcp", coordinator__groups_per_epoch=6, worker__group_size=4)
    run_dir.mkdir(parents=True)
    RunDir(run_dir).config.write_text(cfg.dump())
    RunDir(run_dir).metrics.write_text('{"epoch": 0, "version": 1}\n')
    if checkpoint:
        (run_dir / "checkpoints" / "v1").mkdir(parents=True)
        (run_dir / "checkpoints" / "v1" / "DONE").write_text("1")
    return RunDir(run_dir).config.read_bytes()


def up(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["up", *args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "fields"),
    [
        (["--set", "coordinator.groups_per_epoch=8"], ["coordinator.groups_per_epoch (6 -> 8)"]),
        (["--mode", "sync"], ["run.mode ('periodic' -> 'sync')"]),
        (["--set", "trainer.lr=0.5", "--set", "worker.sampling.temperature=0.5"], ["trainer.lr", "temperature"]),
        (["--config", "configs/sim.yaml"], ["coordinator.groups_per_epoch (6 -> 16)", "worker.group_size (4 -> 8)"]),
    ],
    ids=["set-B", "mode", "two-fields", "another-config"],
)
def test_resume_refuses_to_change_what_is_trained(tmp_path: Path, args: list[str], fields: list[str]) -> None:
    stored = a_run(tmp_path / "run")
    code, out = up("--resume", "--run-dir", str(tmp_path / "run"), "--epochs", "9", *args)
    assert code == 2
    (line,) = [x for x in out.splitlines() if x.startswith("error:")]
    assert "--resume continues the run in RUN_DIR/config.yaml and cannot change" in line
    for field in fields:
        assert field in line
    assert "run.epochs" not in line  # epochs are safe to change
    assert RunDir(tmp_path / "run").config.read_bytes() == stored  # never rewritten


def test_resume_needs_a_run_and_a_checkpoint(tmp_path: Path) -> None:
    code, out = up("--resume", "--run-dir", str(tmp_path / "empty"))
    assert code == 2 and "nothing to resume in" in out and "no config.yaml" in out
    a_run(tmp_path / "run", checkpoint=False)
    code, out = up("--resume", "--run-dir", str(tmp_path / "run"))
    assert code == 2 and "trained epochs but no checkpoint" in out


def test_a_run_dir_in_use_by_a_live_up_is_refused(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    a_run(run.root)
    with run.lock():  # as a running `up` holds it
        code, out = up("--resume", "--run-dir", str(run.root), "--epochs", "9")
        assert code == 2 and "is in use by a running `prl-actors up`" in out
        code, out = up("--config", "configs/sim.yaml", "--run-dir", str(tmp_path / "run"), "--epochs", "1")
        assert code == 2  # without --resume: refused as a run dir that already holds a run


def test_safe_fields_are_what_does_not_change_the_training() -> None:
    run = load_config(None, {"worker.engine": "sim", "trainer.learner": "sim"})
    safe = {
        "run.epochs": 99, "run.workers": 7, "transport.base_port": 30000, "transport.join_timeout_s": 5,
        "coordinator.heartbeat_timeout_s": 30, "worker.threads": 4, "trainer.device": "cuda",
        "trainer.checkpoint_every": 5, "publisher.chunk_bytes": 1 << 20, "run.stop_grace_s": 1,
    }  # fmt: skip
    check_resume(run, load_config(None, {"worker.engine": "sim", "trainer.learner": "sim", **safe}))
    for field in ("run.seed", "run.mode", "worker.group_size", "trainer.beta", "model.dtype", "task.name", "sim.lr"):
        assert not safe_on_resume(field), field
    with pytest.raises(ConfigError, match=r"run\.seed \(0 -> 1\)"):
        check_resume(run, load_config(None, {"worker.engine": "sim", "trainer.learner": "sim", "run.seed": 1}))
