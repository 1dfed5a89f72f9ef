"""Issue 23 against a live run (real processes, CURVE on tcp): an authenticated worker that returns
malformed groups for the work it was assigned (NaN reward, garbage text, a token outside the
vocabulary, another prompt, too many samples, an over-long response) is refused group by group,
each group is generated again by an honest worker, the run completes and trains exactly what an
unattacked run trains, and `prl-actors replay --check` is green. The insider harness is
tests/test_attacks.py's."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import zmq

from prl_actors.config import Config
from prl_actors.launch.process import LocalCluster
from prl_actors.protocol import messages as m
from prl_actors.replay.checks import run_checks
from prl_actors.replay.events import load_run
from prl_actors.tasks.base import exact_match
from tests.conftest import read_logs, sim_config, wait_for, worker_contract
from tests.test_attacks import EPOCHS, WORKERS, ask, insider, reference, trained_as_unattacked, work_for_evil

__all__ = ["reference"]  # the unattacked run's rewards (a module fixture of test_attacks)

G, TOKENS = 4, 4


def group_for(prompt: m.Prompt, epoch: int) -> m.GroupResult:
    """What an honest sim worker would send for `prompt` (before the insider spoils it)."""
    samples = [
        m.Sample(
            text=str(a),
            token_ids=[a] * TOKENS,
            logprobs=[-1.0] * TOKENS,
            reward=exact_match(prompt.prompt, str(a), prompt.answer),
        )
        for a in (1, 2, 3, 4)
    ]
    ctx = int(prompt.prompt.split()[-1])
    group = m.Group(
        group_id=prompt.group_id, prompt=prompt.prompt, prompt_ids=[ctx], samples=samples, worker="worker-evil"
    )
    return m.GroupResult(sender="worker-evil", epoch=epoch, version=epoch, group=group, ticket=prompt.ticket)


def spoiled(kind: str, msg: m.GroupResult) -> m.GroupResult:
    s0 = msg.group.samples[0]
    if kind == "non_finite":
        s0.reward = math.nan
    elif kind == "bad_text":
        s0.text = "\ufffd garbage \x00"
    elif kind == "bad_tokens":
        s0.token_ids = [10**6] * TOKENS
    elif kind == "wrong_prompt":
        msg.group.prompt = "ctx 99"
    elif kind == "bad_group_size":
        msg.group.samples = [*msg.group.samples, s0]
    elif kind == "reward_mismatch":
        for s in msg.group.samples:
            s.reward = 1000.0  # well-formed, but not what the task's reward says
    elif kind == "too_long":
        s0.token_ids, s0.logprobs = [1] * 2000, [-1.0] * 2000
    return msg


KINDS = ("non_finite", "bad_text", "bad_tokens", "wrong_prompt", "bad_group_size", "too_long")


def live_config(run_dir: Path, **overrides: object) -> Config:
    return sim_config(run_dir, transport="tcp", run__epochs=EPOCHS, sim__gen_s_per_token=0.02, **overrides)


def run_with_insider(run_dir: Path, cfg: Config, kinds: tuple[str, ...]) -> list[m.Msg | None]:
    """The insider registers as a worker and answers each of its assignments with a spoiled group."""
    cluster = LocalCluster(cfg, workers=WORKERS, log_dir=run_dir / "logs")
    ctx = zmq.Context()
    replies: list[m.Msg | None] = []
    try:
        wait_for(run_dir, lambda e: e["event"] == "epoch_open" and e["actor"] == "coordinator" and e["epoch"] == 1)
        coord, buf = insider(ctx, cfg, "coordinator"), insider(ctx, cfg, "buffer")
        joining = m.Register(role=m.Role.WORKER, sender="worker-evil", contract=worker_contract(cfg))
        assert isinstance(ask(coord, joining), m.Welcome)
        for kind in kinds:
            try:
                assign = work_for_evil(coord, timeout_s=10.0)
            except AssertionError:
                replies.append(None)  # expelled: no more work
                continue
            replies.append(ask(buf, spoiled(kind, group_for(assign.prompts[0], assign.epoch))))
        assert cluster.wait(60), "the run with a misbehaving insider did not finish"
    finally:
        ctx.destroy(linger=0)
        cluster.close()
    return replies


def replay_green(run_dir: Path) -> None:
    failed = [(r.name, r.violations[:3]) for r in run_checks(load_run(run_dir)) if not r.ok]
    assert not failed, failed


def test_malformed_groups_from_an_authenticated_worker_are_refused_requeued_and_the_run_completes(
    run_dir: Path, reference: list[float]
) -> None:
    cfg = live_config(run_dir, run__max_bad_groups=100)
    replies = run_with_insider(run_dir, cfg, KINDS)
    reasons = [r.reason if isinstance(r, m.GroupAck) and not r.accepted else r for r in replies]
    assert reasons == list(KINDS), replies
    trained_as_unattacked(run_dir, reference)  # every group once, by the run's own workers, same rewards
    requeued = [e for e in read_logs(run_dir) if e["event"] == "group_refused" and e["actor"] == "coordinator"]
    assert sorted(e["reason"] for e in requeued) == sorted(KINDS)
    replay_green(run_dir)


def test_verify_rewards_refuses_rewards_a_worker_made_up(run_dir: Path, reference: list[float]) -> None:
    cfg = live_config(run_dir, buffer__verify_rewards=True)
    replies = run_with_insider(run_dir, cfg, ("reward_mismatch",))
    assert [r.reason if isinstance(r, m.GroupAck) else r for r in replies] == ["reward_mismatch"]
    trained_as_unattacked(run_dir, reference)  # the honest workers' rewards re-score equal: all accepted
    replay_green(run_dir)


def test_a_worker_refused_max_bad_groups_times_is_expelled_and_its_key_refused(
    run_dir: Path, reference: list[float]
) -> None:
    cfg = live_config(run_dir, run__max_bad_groups=2)
    replies = run_with_insider(run_dir, cfg, ("non_finite", "bad_tokens", "bad_text"))
    assert [r.reason if isinstance(r, m.GroupAck) else r for r in replies] == ["non_finite", "bad_tokens", None]
    trained_as_unattacked(run_dir, reference)
    events = read_logs(run_dir)
    (expelled,) = [e for e in events if e["event"] == "member_expelled"]
    assert expelled["member"] == "worker-evil"
    replay_green(run_dir)


def test_status_carries_the_expulsion_notice_and_the_key_is_refused(run_dir: Path) -> None:
    cfg = live_config(run_dir, run__max_bad_groups=1)
    cluster = LocalCluster(cfg, workers=WORKERS, log_dir=run_dir / "logs")
    ctx = zmq.Context()
    try:
        wait_for(run_dir, lambda e: e["event"] == "epoch_open" and e["actor"] == "coordinator" and e["epoch"] == 1)
        coord, buf = insider(ctx, cfg, "coordinator"), insider(ctx, cfg, "buffer")
        joining = m.Register(role=m.Role.WORKER, sender="worker-evil", contract=worker_contract(cfg))
        assert isinstance(ask(coord, joining), m.Welcome)
        assign = work_for_evil(coord, timeout_s=10.0)
        ask(buf, spoiled("non_finite", group_for(assign.prompts[0], assign.epoch)))
        wait_for(run_dir, lambda e: e["event"] == "member_expelled")
        from prl_actors.launch.client import request
        from prl_actors.transport.auth import KeyStore

        status = request(cfg.address("coordinator"), m.StatusRequest(), keys=KeyStore(cfg.keys_path()))
        assert isinstance(status, m.Status) and status.notices_total >= 1
        assert any("expelled worker-evil" in n for n in status.notices), msgspec.to_builtins(status)
        refused = ask(insider(ctx, cfg, "coordinator"), msgspec.structs.replace(joining, id=m.new_id()))
        assert isinstance(refused, m.Error) and refused.code == m.ErrorCode.FORBIDDEN
        assert cluster.wait(60)
    finally:
        ctx.destroy(linger=0)
        cluster.close()
