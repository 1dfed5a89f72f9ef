"""Checkpoints carry checksums in their DONE marker; a damaged newest one falls back to the one before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prl_actors.config import load_config
from prl_actors.records.logs import EventLog
from prl_actors.records.rundir import DONE, CheckpointError, RunDir
from prl_actors.training.sim import SimLearner

pytestmark = pytest.mark.fast

SIM = {"worker.engine": "sim", "trainer.learner": "sim", "sim.train_s_per_sample": 0.0}


def sim_learner() -> SimLearner:
    cfg = load_config(None, SIM)
    return SimLearner(cfg.sim, cfg.run.seed)


def three_checkpoints(root: Path) -> tuple[RunDir, SimLearner, list[np.ndarray]]:
    """v1, v2, v3 of a sim learner; returns the thetas they hold."""
    run, learner, thetas = RunDir(root), sim_learner(), []
    for _ in range(3):
        learner.step()
        run.save_checkpoint(learner.version, learner.save_checkpoint)
        thetas.append(learner.theta.copy())
    return run, learner, thetas


def test_intact_checkpoints_resume_from_the_newest(tmp_path: Path) -> None:
    run, _, _ = three_checkpoints(tmp_path)
    assert run.latest_checkpoint() == tmp_path / "checkpoints" / "v3"


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda f: f.write_bytes(f.read_bytes()[:-50]), "does not match its checksum"),  # truncated
        (lambda f: f.write_bytes(b"\0" + f.read_bytes()[1:]), "does not match its checksum"),  # flipped
        (lambda f: f.unlink(), "is missing"),  # DONE present, file gone
    ],
    ids=["truncated", "corrupted", "deleted"],
)
def test_a_damaged_newest_checkpoint_falls_back_with_a_warning(tmp_path: Path, damage, why: str, capsys) -> None:  # type: ignore[no-untyped-def]
    run, _, thetas = three_checkpoints(tmp_path)
    damage(tmp_path / "checkpoints" / "v3" / "sim.npz")
    skipped: list[tuple[str, str]] = []
    echo = RunDir(tmp_path, echo=True)
    found = echo.latest_checkpoint(on_skip=lambda p, w: skipped.append((p.name, w)))
    assert found == tmp_path / "checkpoints" / "v2"
    assert skipped == [("v3", f"sim.npz {why}")]
    assert "warning: resuming from v2: v3 is damaged" in capsys.readouterr().err
    learner = sim_learner()
    learner.load_checkpoint(found)
    assert learner.version == 2 and np.array_equal(learner.theta, thetas[1])


def test_no_intact_checkpoint_is_an_error_naming_each(tmp_path: Path) -> None:
    run, _, _ = three_checkpoints(tmp_path)
    for v in (1, 2, 3):
        (tmp_path / "checkpoints" / f"v{v}" / "sim.npz").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="v3 is damaged .*v2 is damaged .*v1 is damaged"):
        run.latest_checkpoint()


def test_an_incomplete_checkpoint_is_ignored_and_a_legacy_marker_trusted(tmp_path: Path) -> None:
    run, _, _ = three_checkpoints(tmp_path)
    (tmp_path / "checkpoints" / "v3" / DONE).unlink()  # cut short before its marker
    (tmp_path / "checkpoints" / "v2" / DONE).write_text("2")  # written before markers had checksums
    assert run.latest_checkpoint() == tmp_path / "checkpoints" / "v2"


def test_the_trainer_logs_the_checkpoint_it_skipped(tmp_path: Path) -> None:
    from prl_actors.trainer.core import TrainerCore

    three_checkpoints(tmp_path)
    (tmp_path / "checkpoints" / "v3" / "sim.npz").write_bytes(b"garbage")
    log = EventLog("trainer", "trainer", tmp_path / "trainer.jsonl")
    core = TrainerCore("trainer", log, sim_learner(), RunDir(tmp_path), 4, 1 << 20, 5.0)
    core.resume = True
    core.start(0.0)
    log.close()
    assert core.learner.version == 2
    text = (tmp_path / "trainer.jsonl").read_text()
    assert '"checkpoint_skipped"' in text and "v3" in text
