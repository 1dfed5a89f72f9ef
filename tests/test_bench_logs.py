"""The heal and startup benchmarks read a run's events from logs/<actor>.jsonl and from the .jsonl.gz
an ended run's large logs are moved into (rundir.compress_logs), as replay does."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from prl_bench import heal, startup

pytestmark = pytest.mark.fast


def _event(actor: str, event: str, t: float, **extra: object) -> str:
    return json.dumps({"actor": actor, "event": event, "t_mono": t, "t_wall": 100.0 + t, **extra}) + "\n"


def test_bench_readers_read_gzipped_and_plain_logs(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    assert heal.log_events(tmp_path / "missing") == [] and heal.log_events(tmp_path) == []
    with gzip.open(logs / "coordinator.jsonl.gz", "wt") as f:  # the run's first part, compressed at its end
        f.write(_event("coordinator", "actor_start", 0.0, pid=1) + _event("coordinator", "epoch_open", 1.0))
    (logs / "coordinator.jsonl").write_text(_event("coordinator", "epoch_done", 2.0, done_epoch=0))  # its resume
    with gzip.open(logs / "trainer.jsonl.gz", "wt") as f:
        f.write(_event("trainer", "actor_start", 0.5, pid=2) + _event("trainer", "actor_ready", 0.7))
    (logs / "worker-0.jsonl").write_text(_event("worker-0", "actor_start", 0.6, pid=3) + '{"actor": "worker-0", "ev')
    events = heal.log_events(tmp_path)
    assert [(e["actor"], e["event"]) for e in events] == [
        ("coordinator", "actor_start"),
        ("coordinator", "epoch_open"),
        ("coordinator", "epoch_done"),
        ("trainer", "actor_start"),
        ("trainer", "actor_ready"),
        ("worker-0", "actor_start"),  # a live run's half-written last line: skipped
    ]
    assert heal._opened(tmp_path)
    assert startup._phases(events, 100.0) == "trainer 0.5/0.7, epoch 0 open 1.0 (s after up: started/ready)"
