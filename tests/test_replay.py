"""`prl-actors replay`: a recorded run passes --check and the coordinator replay; doctored logs fail
with a message naming the offending events. Runs are real (all actors in one process, LocalCluster)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prl_actors.cli.main import app
from prl_actors.launch.process import LocalCluster
from prl_actors.replay.checks import run_checks
from prl_actors.replay.coordinator_replay import replay_coordinator
from prl_actors.replay.events import load_run
from tests.conftest import read_logs, sim_config, wait_for

EPOCHS, GROUPS = 3, 8
runner = CliRunner()


def record_run(run_dir: Path, mode: str = "periodic", workers: int = 2, **overrides: Any) -> Path:
    """A real run (sim engine and learner) with its config.yaml, as `prl-actors up` leaves it."""
    settings: dict[str, Any] = {
        "run__mode": mode,
        "run__epochs": EPOCHS,
        "coordinator__groups_per_epoch": GROUPS,
        "sim__gen_s_per_token": 0.005,  # 4 tokens x 4 samples: 80 ms per group
        "sim__train_s_per_sample": 0.005,  # 20 ms per group
        "worker__max_batch_rows": 4,  # one group at a time: they finish one by one (as lengths vary in an LM)
    }
    cfg = sim_config(run_dir, **{**settings, **overrides})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfg.dump())
    cluster = LocalCluster(cfg, workers=workers, log_dir=run_dir / "logs")
    try:
        assert cluster.wait(30), "run did not finish"
    finally:
        cluster.close()
    return run_dir


def doctor(src: Path, dst: Path, actor: str, edit: Callable[[list[dict]], list[dict]]) -> Path:
    """Copy a run dir and rewrite one actor's log through `edit`."""
    shutil.copytree(src, dst)
    return rewrite(dst, actor, edit)


def rewrite(run_dir: Path, actor: str, edit: Callable[[list[dict]], list[dict]]) -> Path:
    path = run_dir / "logs" / f"{actor}.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(e) + "\n" for e in edit(events)))
    return run_dir


def replay_cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["replay", *args])
    return result.exit_code, result.output


def find(events: list[dict], **match: object) -> int:
    return next(i for i, e in enumerate(events) if all(e.get(k) == v for k, v in match.items()))


@pytest.fixture(scope="module")
def periodic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_run(tmp_path_factory.mktemp("replay") / "periodic")


def test_a_recorded_run_passes_check_and_the_coordinator_replay(periodic: Path) -> None:
    code, out = replay_cli(str(periodic), "--check")
    assert code == 0, out
    for name in ("on-policy", "exactly-once", "one-step", "replies", "coordinator"):
        assert f"check {name}" in out and "FAIL" not in out
    report = replay_coordinator(load_run(periodic))
    assert report.divergence is None and report.inputs > 50 and report.decisions > 50


def test_the_summary_has_a_row_per_epoch_with_groups_and_idle(periodic: Path) -> None:
    code, out = replay_cli(str(periodic))
    assert code == 0, out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in ([str(e)] for e in range(EPOCHS))]
    assert [r[0] for r in rows] == [str(e) for e in range(EPOCHS)]
    assert all(r[1] == f"v{e}" and r[-4] == str(GROUPS) for e, r in enumerate(rows)), out
    assert "trainer_idle" in out and "worker_idle" in out and "joined" in out


def test_a_sample_trained_with_another_version_fails_on_policy(periodic: Path, tmp_path: Path) -> None:
    def edit(events: list[dict]) -> list[dict]:
        events[find(events, event="train_group", msg_epoch=1, group_id=2)]["msg_version"] = 0
        return events

    code, out = replay_cli(str(doctor(periodic, tmp_path / "run", "trainer", edit)), "--check")
    assert code == 1
    assert "check on-policy     FAIL" in out
    assert "group 2 of epoch 1 (trainer +" in out and "trained with version 0, epoch 1 is bound to v1" in out


def test_a_group_generated_with_another_version_fails_on_policy(periodic: Path, tmp_path: Path) -> None:
    accepted = next(e for e in read_logs(periodic) if e["event"] == "group_accepted" and e["msg_epoch"] == 2)

    def edit(events: list[dict]) -> list[dict]:
        events[find(events, event="group_sent", msg_id=accepted["msg_id"])]["msg_version"] = 1
        return events

    code, out = replay_cli(str(doctor(periodic, tmp_path / "run", accepted["worker"], edit)), "--check")
    assert code == 1
    assert f"group {accepted['group_id']} of epoch 2" in out
    assert f"was generated with version 1 ({accepted['worker']} +" in out and accepted["msg_id"] in out


def test_a_group_trained_twice_fails_exactly_once(periodic: Path, tmp_path: Path) -> None:
    def edit(events: list[dict]) -> list[dict]:
        i = find(events, event="train_group", msg_epoch=1, group_id=3)
        twice = dict(events[i], t_mono=events[i]["t_mono"] + 1e-4)
        return [*events[: i + 1], twice, *events[i + 1 :]]

    code, out = replay_cli(str(doctor(periodic, tmp_path / "run", "trainer", edit)), "--check")
    assert code == 1
    assert "check exactly-once  FAIL" in out and "group 3 of epoch 1 trained 2 times: trainer +" in out


def test_a_missing_group_fails_exactly_once(periodic: Path, tmp_path: Path) -> None:
    def edit(events: list[dict]) -> list[dict]:
        del events[find(events, event="train_group", msg_epoch=2, group_id=5)]
        return events

    code, out = replay_cli(str(doctor(periodic, tmp_path / "run", "trainer", edit)), "--check")
    assert code == 1
    assert "epoch 2 stepped (trainer +" in out and "but groups [5] were never trained" in out


def test_a_dropped_reply_fails_the_reply_check(periodic: Path, tmp_path: Path) -> None:
    worker_log = [e for e in read_logs(periodic) if e["actor"] == "worker-0"]
    reply = next(e for e in worker_log if e["event"] == "recv" and e["type"] == "work_assign")

    def edit(events: list[dict]) -> list[dict]:
        return [e for e in events if not (e["event"] == "recv" and e["msg_id"] == reply["msg_id"])]

    code, out = replay_cli(str(doctor(periodic, tmp_path / "run", "worker-0", edit)), "--check")
    assert code == 1
    assert "check replies       FAIL" in out
    assert "work_request from worker-0 +" in out and f"msg {reply['reply_to']} to coordinator" in out
    assert "coordinator replied (coordinator +" in out and f"msg {reply['msg_id']}" in out
    assert "worker-0 never logged receiving it" in out


def test_an_unanswered_request_fails_the_reply_check(periodic: Path, tmp_path: Path) -> None:
    fetch = next(e for e in read_logs(periodic) if e["event"] == "recv" and e["type"] == "fetch_weights")

    def no_reply(events: list[dict]) -> list[dict]:  # the reply is neither sent nor received
        return [e for e in events if e.get("reply_to") != fetch["msg_id"]]

    run_dir = rewrite(doctor(periodic, tmp_path / "run", "publisher", no_reply), fetch["sender"], no_reply)
    run = load_run(run_dir)
    sent = next(e for e in run.by_actor[fetch["sender"]] if e["event"] == "send" and e["msg_id"] == fetch["msg_id"])
    got = next(e for e in run.by_actor["publisher"] if e["event"] == "recv" and e["msg_id"] == fetch["msg_id"])
    checks = {r.name: r for r in run_checks(run, replay=False)}
    assert [v.message for v in checks["replies"].violations] == [
        f"fetch_weights from {fetch['sender']} +{sent['t']:.3f}s msg {fetch['msg_id']} to publisher: publisher "
        f"received it (+{got['t']:.3f}s) and never replied, nor did {fetch['sender']} log a timeout"
    ]


def test_a_changed_coordinator_decision_is_the_first_divergence(periodic: Path, tmp_path: Path) -> None:
    def edit(events: list[dict]) -> list[dict]:
        events[[i for i, e in enumerate(events) if e["event"] == "assign"][5]]["groups"] = [99]
        return events

    code, out = replay_cli(str(doctor(periodic, tmp_path / "run", "coordinator", edit)), "--replay-coordinator")
    assert code == 1
    line = next(line for line in out.splitlines() if "input #" in line)
    assert "(work_request" in line and "expected send work_assign -> id:worker-" in line
    assert "groups=[99]" in line.split(", got ")[0] and "groups=[99]" not in line.split(", got ")[1]


def test_a_lost_worker_run_passes_and_shows_the_leave_and_requeue(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = sim_config(run_dir, run__epochs=3, sim__gen_s_per_token=0.02, coordinator__max_groups_per_request=2)
    (run_dir).mkdir(parents=True)
    (run_dir / "config.yaml").write_text(cfg.dump())
    cluster = LocalCluster(cfg, workers=2, log_dir=run_dir / "logs")
    try:
        wait_for(run_dir, lambda e: e["event"] == "assign" and e["worker"] == "worker-0")
        cluster.remove_worker("worker-0", graceful=False)
        assert cluster.wait(30)
    finally:
        cluster.close()
    code, out = replay_cli(str(run_dir), "--check")
    assert code == 0, out
    assert "worker-0 left (heartbeat_timeout)" in out and "requeued groups [" in out
    assert "of worker-0 (heartbeat_timeout)" in out


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "does not exist"),
        (lambda d: (d / "logs").mkdir(parents=True), "no logs in"),
        (
            lambda d: _write(d, "trainer", '{"event": "a", "actor": "trainer", "t_mono": 1}\n{oops\n{"x": 1}\n'),
            "trainer.jsonl:2: not valid JSON",
        ),
        (lambda d: _write(d, "trainer", '{"event": "a", "t_mono": 1}\n'), "trainer.jsonl:1: not a log event"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path, setup: Callable[[Path], None], message: str) -> None:
    run_dir = tmp_path / "run"
    setup(run_dir)
    code, out = replay_cli(str(run_dir), "--check")
    assert code == 2
    assert message in out and "Traceback" not in out and len(out.strip().splitlines()) == 1, out


def _write(run_dir: Path, actor: str, text: str) -> None:
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / f"{actor}.jsonl").write_text(text)


def test_bad_filters_and_a_missing_config_are_bad_input(periodic: Path, tmp_path: Path) -> None:
    code, out = replay_cli(str(periodic), "--filter", "colour=red")
    assert code == 2 and "bad --filter 'colour=red'" in out
    shutil.copytree(periodic, tmp_path / "run")
    (tmp_path / "run" / "config.yaml").unlink()
    code, out = replay_cli(str(tmp_path / "run"), "--replay-coordinator")
    assert code == 2 and "no config.yaml" in out
    code, out = replay_cli(str(tmp_path / "run"), "--check")
    assert code == 0 and "check coordinator   skip" in out


def test_a_run_stopped_mid_epoch_and_resumed_passes_check(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = sim_config(run_dir, run__epochs=4, sim__gen_s_per_token=0.004)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(cfg.dump())
    cluster = LocalCluster(cfg, workers=2, log_dir=run_dir / "logs")
    try:
        wait_for(run_dir, lambda e: e["event"] == "train_group" and e["msg_epoch"] == 2)
    finally:
        cluster.close()  # stopped mid-epoch 2: its gradients are lost, checkpoint v2 remains
    resumed = sim_config(run_dir, run__epochs=4, run__resume=True)
    cluster = LocalCluster(resumed, workers=2, log_dir=run_dir / "logs")
    try:
        assert cluster.wait(30)
    finally:
        cluster.close()
    code, out = replay_cli(str(run_dir), "--check")
    assert code == 0, out
    assert "4 stepped epochs, every group trained once" in out
