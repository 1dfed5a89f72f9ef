"""Issue 39 item 4: the audit cannot be forged. An insider (a registered worker key) floods the buffer
with groups it was never assigned; every refusal past the first LOUD_FIRST is not logged one by one but
in `refusals` summaries, which replay reads: `replay --check` stays green (before, every unlogged
refusal was a `group_result ... never answered` violation) and its summary names the flooding key."""

from __future__ import annotations

from pathlib import Path

import zmq

from prl_actors.config import Config
from prl_actors.protocol import encode
from prl_actors.replay.checks import render_checks, run_checks
from prl_actors.replay.events import load_run
from prl_actors.runtime.refusals import LOUD_FIRST
from tests.conftest import read_logs
from tests.test_attacks import B, attacked, fake_group, insider

FLOOD = 4 * LOUD_FIRST


def flood(ctx: zmq.Context, cfg: Config) -> int:  # type: ignore[type-arg]
    """FLOOD made-up groups (no ticket: each refused `forbidden`) as fast as they go; the replies read."""
    buf = insider(ctx, cfg, "buffer")
    for g in range(FLOOD):
        msg = fake_group(g % B, 1)
        buf.send_multipart(encode(msg))
    answered = 0
    while answered < FLOOD and buf.poll(10_000):  # a deadline per reply, not a timing claim
        buf.recv_multipart()
        answered += 1
    return answered


def test_a_flood_of_refused_groups_is_accounted_for_and_names_the_attacker(run_dir: Path) -> None:
    assert attacked(run_dir, flood) == FLOOD  # every one answered
    events = read_logs(run_dir)
    one_by_one = [e for e in events if e["event"] == "refused" and e["actor"] == "buffer"]
    summarised = [row for e in events if e["event"] == "refusals" and e["actor"] == "buffer" for row in e["refused"]]
    assert len(one_by_one) == LOUD_FIRST, len(one_by_one)  # the disk is still protected
    assert sum(r["count"] for r in summarised) == FLOOD - LOUD_FIRST, summarised  # ... and nothing is lost
    assert {(r["principal"], r["sender"], r["type"]) for r in summarised} == {
        ("worker-evil", "worker-evil", "group_result")
    }
    results = run_checks(load_run(run_dir))
    report = render_checks(results)
    assert all(r.ok for r in results), report
    replies = next(r for r in results if r.name == "replies")
    n = FLOOD - LOUD_FIRST
    assert f"refusals in rate-limited summaries: worker-evil to buffer {n} ({n} of them" in replies.summary, report


def test_counters_keep_each_unlogged_refusal_for_the_summary_by_sender_and_key() -> None:
    from prl_actors.runtime.refusals import SUMMARY_ROWS, Counters

    c = Counters()
    loud = [c.loud("refused.forbidden", ("group_result", "worker-evil", "worker-evil")) for _ in range(LOUD_FIRST + 10)]
    assert loud.count(True) == LOUD_FIRST
    for _ in range(LOUD_FIRST + 5):
        c.loud("reward_errors")  # rate-limited, but not a refusal: counted, never summarised
    assert c.take_summary() == [
        {"kind": "refused.forbidden", "type": "group_result", "sender": "worker-evil", "principal": "worker-evil",
         "count": 10}
    ]  # fmt: skip
    assert c.take_summary() == [] and c.counts["refused.forbidden"] == LOUD_FIRST + 10
    for i in range(LOUD_FIRST + SUMMARY_ROWS + 3):  # made-up sender names fold into "*" past SUMMARY_ROWS rows
        c.loud("unexpected", ("x", f"name-{i}", "worker-evil"))
    rows = c.take_summary()
    assert len(rows) == SUMMARY_ROWS + 1 and sum(r["count"] for r in rows) == SUMMARY_ROWS + 3
    assert [r["count"] for r in rows if r["sender"] == "*"] == [3]
