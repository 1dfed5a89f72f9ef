"""`prl-actors replay` outputs: overlap (periodic overlaps, sync does not), the Perfetto trace, the PNG
timeline, --filter, --follow, and a multi-process `prl-actors up` run that passes --check."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from prl_actors.launch.process import LocalCluster
from prl_actors.replay.epochs import SETUP, stats
from prl_actors.replay.events import load_run
from prl_actors.replay.follow import Filter, follow
from prl_actors.replay.spans import pair_spans
from tests.conftest import port_base, read_logs, sim_config
from tests.test_replay import EPOCHS, doctor, record_run, replay_cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("replay-out")
    return {mode: record_run(base / mode, mode) for mode in ("periodic", "sync")}


def epoch_rows(run_dir: Path) -> list:  # type: ignore[type-arg]
    run = load_run(run_dir)
    return [r for r in stats(run, pair_spans(run)) if r.window.epoch != SETUP]


def test_periodic_trains_while_workers_generate_and_sync_does_not(runs: dict[str, Path]) -> None:
    periodic, sync = epoch_rows(runs["periodic"]), epoch_rows(runs["sync"])
    assert len(periodic) == len(sync) == EPOCHS
    for r in periodic:  # 8 groups of 80 ms on 2 workers, 20 ms of training each: ~3/4 of training overlaps
        assert r.overlap_s > 0.3 * r.train_s > 0, (r.window, r.overlap_s, r.train_s)
    for r in sync:  # the buffer releases the batch only when generation is over
        assert r.overlap_s == 0.0 and r.train_s > 0, (r.window, r.overlap_s)
    assert sum(r.trainer_idle for r in periodic) < sum(r.trainer_idle for r in sync)


def test_the_trace_is_trace_event_json_with_a_track_per_actor(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    code, text = replay_cli(str(runs["periodic"]), "--trace", str(out))
    assert code == 0, text
    events = json.loads(out.read_text())["traceEvents"]
    actors = {e["actor"] for e in read_logs(runs["periodic"])}
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert set(names.values()) == actors and len(names) == len(actors)
    complete = [e for e in events if e["ph"] == "X"]
    assert all(e["pid"] in names and e["dur"] >= 0 and e["ts"] >= 0 and e["tid"] >= 1 for e in complete)
    by_actor = {(names[e["pid"]], e["name"]) for e in complete}
    for actor, span in [("trainer", "train"), ("trainer", "optimizer_step"), ("trainer", "weight_upload")]:
        assert (actor, span) in by_actor
    for span in ("generate", "score", "weight_sync", "idle"):
        assert ("worker-0", span) in by_actor
    boundaries = [e for e in events if e["ph"] == "i" and e.get("s") == "g"]
    assert [e["name"] for e in boundaries] == [f"epoch {i} (v{i})" for i in range(EPOCHS)]
    for pid in names:  # complete events on one thread must nest: lanes keep them disjoint
        for tid in {e["tid"] for e in complete if e["pid"] == pid}:
            lane = sorted((e["ts"], e["ts"] + e["dur"]) for e in complete if (e["pid"], e["tid"]) == (pid, tid))
            assert all(a[1] <= b[0] + 1e-3 for a, b in zip(lane, lane[1:], strict=False)), (names[pid], tid)


def test_the_timeline_png_is_written(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "img" / "timeline.png"
    code, text = replay_cli(str(runs["sync"]), "--timeline", str(out))
    assert code == 0, text
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_filter_by_actor_epoch_and_message_id(runs: dict[str, Path]) -> None:
    run_dir = runs["periodic"]
    code, out = replay_cli(str(run_dir), "--filter", "actor=worker-0", "--filter", "epoch=1")
    assert code == 0
    lines = out.splitlines()[:-1]  # the last line is the "N of M events match" note
    want = [e for e in read_logs(run_dir) if e["actor"] == "worker-0" and 1 in (e["epoch"], e.get("msg_epoch"))]
    assert len(lines) == len(want) > 5 and all(" worker-0 " in line for line in lines)
    request = next(e for e in read_logs(run_dir) if e["event"] == "send" and e["type"] == "work_request")
    code, out = replay_cli(str(run_dir), "--filter", f"msg={request['msg_id']}")
    kinds = [line.split()[1:3] for line in out.splitlines()[:-1]]
    assert [request["actor"], "send"] in kinds and ["coordinator", "recv"] in kinds  # the request, both ends
    assert [request["actor"], "recv"] in kinds and ["coordinator", "coord_input"] in kinds  # its reply, the input


def test_follow_a_finished_run_stops_at_run_done(runs: dict[str, Path]) -> None:
    code, out = replay_cli(str(runs["sync"]), "--follow", "--filter", "actor=coordinator", "--timeout", "10")
    assert code == 0, out
    assert "follow: stopped (run_done)" in out and " run_done " in out


def test_follow_times_out_without_run_done(runs: dict[str, Path], tmp_path: Path) -> None:
    cut = doctor(runs["sync"], tmp_path / "run", "coordinator", lambda es: [e for e in es if e["event"] != "run_done"])
    code, out = replay_cli(str(cut), "--follow", "--filter", "event=epoch_open", "--timeout", "0.5")
    assert code == 1 and "follow: stopped (timeout)" in out and out.count(" epoch_open ") == EPOCHS


def test_follow_a_live_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "live"
    cfg = sim_config(run_dir, run__epochs=2)
    (run_dir / "logs").mkdir(parents=True)
    seen: list[str] = []
    result: list[str] = []
    thread = threading.Thread(target=lambda: result.append(follow(run_dir, Filter(), 20.0, seen.append, 0.05)))
    thread.start()
    cluster = LocalCluster(cfg, workers=2, log_dir=run_dir / "logs")
    try:
        assert cluster.wait(30)
    finally:
        cluster.close()
    thread.join(25)
    assert result == ["run_done"]
    assert any(" run_done " in line for line in seen) and any(" train_group " in line for line in seen)


@pytest.mark.integration
def test_a_multi_process_up_run_passes_check(tmp_path: Path) -> None:
    run_dir = tmp_path / "up"
    cmd = [
        sys.executable,
        "-m",
        "prl_actors.cli.main",
        "up",
        "--config",
        "configs/sim.yaml",
        "--workers",
        "2",
        "--epochs",
        "2",
    ]
    port = port_base()
    cmd += ["--run-dir", str(run_dir), "--set", f"transport.base_port={port}"]
    up = subprocess.run(cmd, cwd=ROOT, timeout=60, capture_output=True, text=True)
    # not `check=True`: `up` may report a core actor's clean exit racing the coordinator's as a failure
    assert any(e["event"] == "run_done" for e in read_logs(run_dir)), up.stderr
    code, out = replay_cli(str(run_dir), "--check")
    assert code == 0, out
    assert "check coordinator   ok" in out and "(clock t_mono)" in out
