"""The replay package's pure pieces: interval arithmetic, span pairing, clock choice, log parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from prl_actors.replay.events import ReplayError, load_run, merge
from prl_actors.replay.follow import parse_filters
from prl_actors.replay.spans import gaps, intersect, pair_spans, total, union
from prl_actors.replay.trace import lanes

pytestmark = pytest.mark.fast


def ev(actor: str, event: str, t: float, **fields: object) -> dict:
    return {"actor": actor, "role": actor.split("-")[0], "event": event, "t_mono": t, "t_wall": 1000 + t, **fields}


def test_interval_arithmetic() -> None:
    assert union([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert intersect([(0, 2), (3, 5)], [(1, 4)]) == [(1, 2), (3, 4)]
    assert gaps([(1, 2), (1.5, 3)], 0, 4) == [(0, 1), (3, 4)]
    assert total([(0, 1), (0.5, 1.5)]) == 1.5


def test_spans_pair_extend_abort_and_close_at_the_end() -> None:
    run = merge(
        [
            ev("worker-0", "span_begin", 0.0, span="weight_sync"),
            ev("worker-0", "span_begin", 0.5, span="weight_sync"),  # a retried fetch: same span
            ev("worker-0", "span_end", 1.0, span="weight_sync"),
            ev("worker-0", "span_begin", 1.0, span="generate"),
            ev("worker-0", "generate_failed", 1.5),
            ev("worker-0", "span_begin", 2.0, span="generate"),
            ev("worker-0", "actor_stopped", 3.0),
        ],
        Path("run"),
    )
    spans = [(s.name, s.begin, s.end, s.unclosed, s.fields.get("failed", False)) for s in pair_spans(run)]
    assert spans == [
        ("weight_sync", 0.0, 1.0, False, False),
        ("generate", 1.0, 1.5, False, True),
        ("generate", 2.0, 3.0, True, False),
    ]


def test_one_host_orders_by_monotonic_time_several_hosts_by_wall_time() -> None:
    one = merge([ev("b", "actor_start", 2.0, host="h"), ev("a", "actor_start", 1.0, host="h")], Path("r"))
    assert one.clock == "t_mono" and [e["actor"] for e in one.events] == ["a", "b"]
    two = [ev("a", "actor_start", 1.0, host="h1"), ev("b", "actor_start", 0.5, host="h2")]
    two[1]["t_wall"] = 2000.0  # b's monotonic clock is earlier, its wall clock later
    assert [e["actor"] for e in merge(two, Path("r")).events] == ["a", "b"]


def test_a_truncated_last_line_is_skipped_with_a_note(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "trainer.jsonl").write_text(
        '{"event": "a", "actor": "trainer", "t_mono": 1}\n{"event": "b", "ac'
    )
    run = load_run(tmp_path)
    assert [e["event"] for e in run.events] == ["a"] and run.notes == ["trainer.jsonl:2: skipped a truncated last line"]


def test_lanes_keep_overlapping_spans_apart() -> None:
    run = merge(
        [
            ev("trainer", "span_begin", 0.0, span="weight_upload"),
            ev("trainer", "span_begin", 0.1, span="train"),
            ev("trainer", "span_end", 0.2, span="weight_upload"),
            ev("trainer", "span_end", 0.3, span="train"),
            ev("trainer", "span_begin", 0.4, span="train"),
            ev("trainer", "span_end", 0.5, span="train"),
        ],
        Path("r"),
    )
    assert [(s.name, tid) for s, tid in lanes(pair_spans(run))] == [("weight_upload", 1), ("train", 2), ("train", 1)]


def test_filters() -> None:
    flt = parse_filters(["actor=worker-*", "epoch=2", "epoch=3", "msg=ab-1"])
    assert flt.matches(ev("worker-1", "send", 0, epoch=3, msg_id="ab-1"))
    assert flt.matches(ev("worker-1", "recv", 0, epoch=1, msg_epoch=2, reply_to="ab-1"))
    assert not flt.matches(ev("worker-1", "send", 0, epoch=1, msg_id="ab-1"))
    assert not flt.matches(ev("trainer", "send", 0, epoch=2, msg_id="ab-1"))
    assert parse_filters(["msg=ab-1"]).matches(ev("coordinator", "coord_input", 0, msg={"id": "ab-1"}))
    for bad in ("actor", "color=red", "epoch=x", "msg="):
        with pytest.raises(ReplayError, match="bad --filter"):
            parse_filters([bad])


def test_one_step_checks_the_m_x_mu_inner_steps() -> None:
    """One published version per epoch, M x mu optimizer steps inside it (config.yaml's trainer)."""
    from prl_actors.replay.invariants import _inner_steps

    step = {**ev("trainer", "optimizer_step", 1.0, version_before=0, version_after=1, optimizer_steps=4), "t": 1.0}
    assert _inner_steps(step, 4) == []
    assert _inner_steps(step, None) == []  # no config.yaml: nothing to compare with
    assert "took 4 optimizer steps inside the epoch, not M x mu = 2" in _inner_steps(step, 2)[0]
    old = ev("trainer", "optimizer_step", 1.0, version_before=0, version_after=1)
    assert _inner_steps(old, 2) == []  # a log from before the field
