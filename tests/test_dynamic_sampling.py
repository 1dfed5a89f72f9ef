"""Dynamic sampling (coordinator.dynamic_sampling): the round rule, and whole runs through the five
actors (sim plane, fast): groups with equal rewards are accepted but never trained, rounds of extra
prompts fill the epoch up to B informative groups, exactly once even with a worker lost mid-epoch,
and `prl-actors replay --check` knows the rule."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from prl_actors.config import load_config
from prl_actors.data import position
from prl_actors.launch import build
from prl_actors.launch.process import LocalCluster
from prl_actors.records.rundir import epoch_line
from prl_actors.training.dynamic_sampling import Rounds, informative
from tests.conftest import read_logs, sim_config, wait_for
from tests.test_replay import replay_cli

pytestmark = pytest.mark.fast

B = 6


def test_informative() -> None:
    assert informative([0.0, 1.0]) and informative([0.5, 0.5, 0.4])
    assert not informative([1.0, 1.0]) and not informative([0.0] * 4) and not informative([])


def test_rounds_hand_out_the_missing_count_until_b_or_the_last_round() -> None:
    r = Rounds(target=4, max_rounds=3)
    assert r.next_round() == []  # round 0 not accepted yet
    for g, useful in ((0, True), (1, False), (2, False)):
        r.accept(g, useful)
    assert r.next_round() == []  # group 3 still out
    r.accept(3, True)
    assert r.next_round() == [4, 5]  # 2 informative of 4: two more
    r.accept(4, False)
    r.accept(5, True)
    assert r.next_round() == [6]
    r.accept(6, False)
    assert r.next_round() == [] and r.short and r.kept == 3 and r.handed_out == 7  # 3 rounds: done
    full = Rounds(target=2, max_rounds=5)
    full.accept(0, True)
    full.accept(1, True)
    assert full.next_round() == [] and not full.short


def test_prompts_come_from_fixed_stream_positions_and_the_position_has_the_stride(tmp_path: Path) -> None:
    cfg = load_config(None, {"coordinator.dynamic_sampling": True, "coordinator.max_sampling_rounds": 3})
    task = build.task(cfg)
    first = task.prompts_at(2 * 3 * 8, list(range(8)))
    assert [p.prompt for p in first] == [p.prompt for p in task.prompts_for_epoch(6, 8)]  # position 48..55
    assert task.prompts_at(48, [9])[0].prompt == task.prompts_at(57, [0])[0].prompt
    ident = task.data_identity(8, 24)
    assert position.record(ident, 2)["offset"] == (2 * 24) % ident["rows"]
    plain = build.task(load_config(None, {})).data_identity(8)
    assert plain["epoch_stride"] == 8
    (tmp_path / "data.json").write_text(json.dumps({k: v for k, v in plain.items() if k != "epoch_stride"}))
    assert position.verify(tmp_path, plain) is not None  # an older record (no stride) is stride B
    with pytest.raises(Exception, match="epoch_stride: 8 -> 24"):
        position.verify(tmp_path, ident | {"sha256": plain["sha256"], "rows": plain["rows"]})


def test_epoch_line_says_kept_of_generated_and_short() -> None:
    row = {"epoch": 0, "version": 1, "groups_kept": 4.0, "groups_generated": 9.0, "groups_target": 6.0}
    assert epoch_line(row).endswith("kept 4/9 groups (short of B=6: sampling rounds ran out)")
    assert epoch_line(row | {"groups_kept": 6.0}).endswith("kept 6/9 groups")
    assert "kept" not in epoch_line({"epoch": 0, "version": 1})


# --- through the actors ---------------------------------------------------------------------------


def dynamic_config(run_dir: Path, **extra: object):  # type: ignore[no-untyped-def]
    return sim_config(
        run_dir,
        run__epochs=3,
        coordinator__dynamic_sampling=True,
        coordinator__max_sampling_rounds=4,
        coordinator__groups_per_epoch=B,
        **extra,
    )


def run_cluster(cfg, workers: int = 2, lose: str = "") -> list[dict]:  # type: ignore[no-untyped-def]
    run_dir = Path(cfg.run.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfg.dump())
    cluster = LocalCluster(cfg, workers=workers, log_dir=run_dir / "logs")
    try:
        if lose:
            wait_for(run_dir, lambda e: e["event"] == "assign" and e["worker"] == lose)
            cluster.remove_worker(lose, graceful=False)
        assert cluster.wait(60), "the run did not finish"
    finally:
        cluster.close()
    return read_logs(run_dir)


def assert_dynamic_invariants(events: list[dict], epochs: int) -> dict[int, list[int]]:
    """Every accepted group is trained once unless filtered; a filtered group has equal rewards and
    is never trained; at most B per epoch. Returns epoch -> trained group ids."""
    accepted, filtered, trained = defaultdict(list), defaultdict(set), defaultdict(list)
    for e in events:
        if e["event"] == "group_accepted" and e["role"] == "buffer":
            accepted[e["msg_epoch"]].append(e["group_id"])
        elif e["event"] == "group_filtered":
            filtered[e["msg_epoch"]].add(e["group_id"])
        elif e["event"] == "train_group":
            trained[e["msg_epoch"]].append(e["group_id"])
    for ep in range(epochs):
        assert len(accepted[ep]) == len(set(accepted[ep])), "a group was accepted twice"
        assert len(trained[ep]) == len(set(trained[ep])), "a group was trained twice"
        assert sorted(trained[ep]) == sorted(set(accepted[ep]) - filtered[ep])
        assert len(trained[ep]) <= B
        assert sorted(accepted[ep]) == list(range(len(accepted[ep]))), "ids are handed out in order, none lost"
    steps = [e for e in events if e["event"] == "optimizer_step"]
    assert [(s["version_before"], s["version_after"]) for s in steps] == [(v, v + 1) for v in range(epochs)]
    return {ep: sorted(ids) for ep, ids in trained.items()}


@pytest.mark.parametrize("mode", ["periodic", "sync"])
def test_equal_reward_groups_are_not_trained_and_rounds_fill_the_epoch(tmp_path: Path, mode: str) -> None:
    events = run_cluster(dynamic_config(tmp_path / "run", run__mode=mode))
    assert_dynamic_invariants(events, 3)
    rounds = [e for e in events if e["event"] == "sampling_round"]
    assert rounds, "no epoch needed a second round: the test does not exercise the rule"
    assert any(e["event"] == "group_filtered" for e in events)
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    done = {e["epoch"]: e for e in events if e["event"] == "sampling_done"}
    for r in rows:
        assert r["groups_target"] == B and r["groups_generated"] == done[r["epoch"]]["generated"]
        assert r["groups_kept"] == done[r["epoch"]]["kept"] <= B
    code, out = replay_cli(str(tmp_path / "run"), "--check")
    assert code == 0, out


def test_periodic_and_sync_generate_and_keep_the_same_groups(tmp_path: Path) -> None:
    """The rounds depend only on the rewards, which are the same in both modes (the sim policy's
    samples are seeded by (seed, version, group id)), so both modes train the same groups."""
    kept = []
    for mode, workers in (("periodic", 3), ("sync", 1)):
        events = run_cluster(dynamic_config(tmp_path / mode, run__mode=mode), workers=workers)
        kept.append(assert_dynamic_invariants(events, 3))
    assert kept[0] == kept[1]
    a, b = ((tmp_path / m / "metrics.jsonl").read_text().splitlines() for m in ("periodic", "sync"))
    for ra, rb in zip(a, b, strict=True):
        ja, jb = json.loads(ra), json.loads(rb)
        assert (ja["groups_kept"], ja["groups_generated"], ja["reward_mean"]) == (
            jb["groups_kept"],
            jb["groups_generated"],
            jb["reward_mean"],
        )


def test_a_worker_lost_mid_epoch_keeps_exactly_once(tmp_path: Path) -> None:
    cfg = dynamic_config(tmp_path / "run", sim__gen_s_per_token=0.02, coordinator__max_groups_per_request=2)
    events = run_cluster(cfg, workers=2, lose="worker-0")
    requeues = [e for e in events if e["event"] == "requeue"]
    assert requeues and requeues[0]["worker"] == "worker-0"
    assert_dynamic_invariants(events, 3)
    code, out = replay_cli(str(tmp_path / "run"), "--check")
    assert code == 0, out


def test_replay_check_catches_a_filtered_group_that_was_trained(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    events = run_cluster(dynamic_config(run_dir))
    filtered = next(e for e in events if e["event"] == "group_filtered")
    trained = next(e for e in events if e["event"] == "train_group" and e["msg_epoch"] == filtered["msg_epoch"])
    log = run_dir / "logs" / "trainer.jsonl"
    lines = log.read_text().splitlines()
    doctored = []
    for line in lines:
        e = json.loads(line)
        same = (e.get("group_id"), e.get("msg_epoch")) == (trained["group_id"], trained["msg_epoch"])
        if e["event"] == "train_group" and same:
            e["group_id"] = filtered["group_id"]
        doctored.append(json.dumps(e))
    log.write_text("\n".join(doctored) + "\n")
    code, out = replay_cli(str(run_dir), "--check")
    assert code == 1
    assert f"trained groups [{filtered['group_id']}] its buffer filtered out" in out
