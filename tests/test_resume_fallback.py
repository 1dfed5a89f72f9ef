"""Issue 23 (4b): a run resumed from an older checkpoint than its last (a damaged newest one is
skipped) is read right: `replay --check` is green (the rolled-back epoch is legitimately redone),
metrics.jsonl holds one row per epoch of the surviving line, and the final line counts the epochs."""

from __future__ import annotations

from pathlib import Path

from prl_actors.launch.process import LocalCluster
from prl_actors.launch.up import summary
from prl_actors.records.rundir import RunDir
from prl_actors.replay.checks import run_checks
from prl_actors.replay.events import load_run
from tests.conftest import sim_config

EPOCHS = 3


def run(cfg, run_dir: Path) -> None:  # type: ignore[no-untyped-def]
    RunDir(run_dir).config.parent.mkdir(parents=True, exist_ok=True)
    RunDir(run_dir).config.write_text(cfg.dump())
    cluster = LocalCluster(cfg, workers=2, log_dir=run_dir / "logs")
    try:
        assert cluster.wait(60)
    finally:
        cluster.close()


def test_a_resume_past_a_damaged_checkpoint_redoes_its_epochs_and_replay_reads_it_right(run_dir: Path) -> None:
    cfg = sim_config(run_dir, run__epochs=EPOCHS)
    run(cfg, run_dir)
    (run_dir / "checkpoints" / f"v{EPOCHS}" / "sim.npz").write_bytes(b"truncated")
    run(cfg.model_copy(update={"run": cfg.run.model_copy(update={"resume": True})}), run_dir)
    rows = RunDir(run_dir).metrics_rows()
    assert [r["epoch"] for r in rows] == list(range(EPOCHS))  # epoch 2 once: the surviving line's row
    assert summary(run_dir, 1.0).startswith(f"done: {EPOCHS} epochs")
    failed = [(r.name, r.violations[:3]) for r in run_checks(load_run(run_dir)) if not r.ok]
    assert not failed, failed


def test_replay_check_counts_trained_tokens_so_a_silently_dropped_group_is_caught(run_dir: Path) -> None:
    """A trainer that lost a micro-batch but still stepped (issue 23: 643 tokens received, 198 trained,
    `exactly-once ok`) fails the trained-tokens check: simulated by deleting one `groups_trained` line."""
    run(sim_config(run_dir, run__epochs=2), run_dir)
    assert all(r.ok for r in run_checks(load_run(run_dir)))
    log = run_dir / "logs" / "trainer.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    drop = next(i for i, line in enumerate(lines) if '"groups_trained"' in line)
    log.write_text("".join(lines[:drop] + lines[drop + 1 :]))
    (tokens,) = [r for r in run_checks(load_run(run_dir)) if r.name == "trained-tokens"]
    assert not tokens.ok and "received tokens" in tokens.violations[0].message
