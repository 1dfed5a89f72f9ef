"""All five actors with real ZeroMQ sockets and pykka actors, in one process (fast tier)."""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec
import pytest
import zmq

from prl_actors.launch.process import LocalCluster
from prl_actors.protocol import decode, encode
from prl_actors.protocol import messages as m
from tests.conftest import assert_invariants, dealer, read_logs, sim_config, wait_for, worker_contract


def run(cfg, workers: int = 2, timeout: float = 30.0) -> LocalCluster:  # type: ignore[no-untyped-def]
    cluster = LocalCluster(cfg, workers=workers, log_dir=Path(cfg.run.run_dir) / "logs")
    try:
        assert cluster.wait(timeout), "run did not finish"
    finally:
        cluster.close()
    return cluster


@pytest.mark.parametrize("mode", ["periodic", "sync"])
def test_both_modes_complete_and_keep_the_invariants(run_dir: Path, mode: str) -> None:
    cfg = sim_config(run_dir, run__mode=mode, run__epochs=3)
    run(cfg)
    assert_invariants(run_dir, epochs=3, groups=6)
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 3
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["v2", "v3"]  # keep_checkpoints: 2


def test_sim_policy_learns(run_dir: Path) -> None:
    cfg = sim_config(run_dir, run__epochs=8, coordinator__groups_per_epoch=16, worker__group_size=8, sim__lr=8.0)
    run(cfg)
    rewards = [msgspec.json.decode(r)["reward_mean"] for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards


def test_close_leaves_the_context_to_an_actor_still_stopping(run_dir: Path) -> None:
    """Destroying the zmq context closes every socket, a live actor's too, and libzmq aborts the
    whole process for that. close() names an actor that has not stopped in time instead."""
    cluster = LocalCluster(sim_config(run_dir), workers=1, log_dir=run_dir / "logs")
    host = cluster.hosts["worker-0"]
    release = threading.Event()
    on_stop = host.on_stop

    def slow_stop() -> None:
        release.wait(30)
        on_stop()

    host.on_stop = slow_stop  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="worker-0 still running 0.5s after close"):
            cluster.close(timeout_s=0.5)
        assert not cluster.ctx.closed
    finally:
        release.set()
        cluster.close()
    assert cluster.ctx.closed


def test_worker_joining_mid_run_gets_weights_then_work(run_dir: Path) -> None:
    cfg = sim_config(run_dir, run__epochs=5, sim__gen_s_per_token=0.004)
    cluster = LocalCluster(cfg, workers=1, log_dir=run_dir / "logs")
    try:  # join once epoch 1 is open: weights v1 exist and v0 is gone from the publisher
        wait_for(run_dir, lambda e: e["event"] == "epoch_open" and e["actor"] == "coordinator" and e["epoch"] == 1)
        late = cluster.add_worker()
        assert cluster.wait(30)
    finally:
        cluster.close()
    events = read_logs(run_dir)
    joined = next(e for e in events if e["event"] == "member_join" and e["member"] == late)
    done = next(e for e in events if e["event"] == "run_done")
    assert joined["epoch"] >= 1 and joined["t_mono"] < done["t_mono"], "the worker did not join mid-run"
    own = [e for e in events if e["actor"] == late]
    synced = next(i for i, e in enumerate(own) if e["event"] == "span_end" and e.get("span") == "weight_sync")
    assert own[synced]["new_version"] >= 1, "it must fetch the open epoch's weights, not the initial ones"
    assert not any(e["event"] in ("span_begin", "group_sent") and e.get("span") != "weight_sync" for e in own[:synced])
    sent = [e for e in own[synced:] if e["event"] == "group_sent"]
    assert sent and all(e["msg_version"] >= own[synced]["new_version"] for e in sent), "no work after the sync"
    assert_invariants(run_dir, epochs=5, groups=6)


def test_worker_lost_mid_epoch_has_its_groups_reassigned(run_dir: Path) -> None:
    cfg = sim_config(run_dir, run__epochs=3, sim__gen_s_per_token=0.02, coordinator__max_groups_per_request=2)
    cluster = LocalCluster(cfg, workers=2, log_dir=run_dir / "logs")
    try:
        wait_for(run_dir, lambda e: e["event"] == "assign" and e["worker"] == "worker-0")
        cluster.remove_worker("worker-0", graceful=False)  # no Leave: only the silence tells
        assert cluster.wait(30)
    finally:
        cluster.close()
    events = read_logs(run_dir)
    requeues = [e for e in events if e["event"] == "requeue"]
    assert requeues and requeues[0]["worker"] == "worker-0" and requeues[0]["reason"] == "heartbeat_timeout"
    assert_invariants(run_dir, epochs=3, groups=6)


def test_garbage_frames_get_errors_and_every_actor_survives(run_dir: Path) -> None:
    cfg = sim_config(run_dir, transport="ipc", run__epochs=3, sim__gen_s_per_token=0.002)
    cluster = LocalCluster(cfg, workers=2, log_dir=run_dir / "logs")
    ctx = zmq.Context()
    garbage = [
        [b"\x00\xffnot msgpack"],
        [msgspec.msgpack.encode({"proto": 99, "type": "register", "id": "g1"})],
        [msgspec.msgpack.encode({"proto": m.PROTOCOL_VERSION, "type": "nonsense", "id": "g2"})],
        [msgspec.msgpack.encode({"proto": m.PROTOCOL_VERSION, "type": "register", "id": "g3"})],
        encode(m.WorkAssign(reply_to="x", prompts=[])),  # valid, but no actor serves it
    ]
    try:
        for role in ("coordinator", "publisher", "buffer"):
            sock = dealer(ctx, cfg, role, "worker-garbage")  # an authenticated peer gone wrong
            codes = []
            for frames in garbage:
                sock.send_multipart(frames)
                assert sock.poll(5000), f"{role} did not answer garbage"
                reply, _ = decode(sock.recv_multipart())
                assert isinstance(reply, m.Error)
                codes.append(reply.code)
            assert codes == ["malformed", "bad_protocol", "unknown_type", "malformed", "unexpected"], role
            sock.close()
        assert cluster.wait(30), "a garbage frame stopped the run"
    finally:
        cluster.close()
        ctx.destroy(linger=0)
    assert_invariants(run_dir, epochs=3, groups=6)
    bad = [e for e in read_logs(run_dir) if e["event"] == "bad_frame"]
    assert {e["actor"] for e in bad} == {"coordinator", "publisher", "buffer"}


def test_resume_continues_from_the_last_checkpoint(run_dir: Path) -> None:
    run(sim_config(run_dir, run__epochs=2))
    run(sim_config(run_dir, run__epochs=4, run__resume=True))
    rows = [msgspec.json.decode(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1, 2, 3]
    assert [r["version"] for r in rows] == [1, 2, 3, 4]


def test_stale_and_duplicate_groups_are_rejected_over_the_wire(run_dir: Path) -> None:
    cfg = sim_config(run_dir, transport="ipc", run__epochs=2)
    cluster = LocalCluster(cfg, workers=0, log_dir=run_dir / "logs")  # epoch 0 opens, nobody works
    ctx = zmq.Context()
    socks = {}
    for actor in ("coordinator", "buffer"):  # a hand-driven worker: it registers and is assigned a group
        socks[actor] = dealer(ctx, cfg, actor, "worker-raw")
    samples = [m.Sample(text="1", token_ids=[1], logprobs=[-0.5], reward=1.0)] * cfg.worker.group_size

    def request(actor: str, msg: m.Msg) -> m.Msg:
        socks[actor].send_multipart(encode(msg))
        assert socks[actor].poll(5000)
        return decode(socks[actor].recv_multipart())[0]

    def send(prompt: m.Prompt, epoch: int, version: int) -> m.GroupAck:
        ctx_ids = [int(prompt.prompt.split()[-1])]  # well-formed (the buffer checks content): the sim's prompt ids
        group = m.Group(group_id=prompt.group_id, prompt=prompt.prompt, prompt_ids=ctx_ids, samples=samples,
                        worker="worker-raw")  # fmt: skip
        reply = request("buffer", m.GroupResult(sender="worker-raw", epoch=epoch, version=version, group=group,
                                                ticket=prompt.ticket))  # fmt: skip
        assert isinstance(reply, m.GroupAck)
        return reply

    try:
        wait_for(run_dir, lambda e: e["event"] == "epoch_open")
        joining = m.Register(role=m.Role.WORKER, sender="worker-raw", contract=worker_contract(cfg))
        assert isinstance(request("coordinator", joining), m.Welcome)
        assign = request("coordinator", m.WorkRequest(sender="worker-raw", epoch=0, version=0))
        assert isinstance(assign, m.WorkAssign)
        (prompt,) = assign.prompts
        assert send(prompt, 0, 1).reason == "stale_version"
        assert send(prompt, 0, 0).accepted
        assert send(prompt, 0, 0).reason == "duplicate"
        cluster.add_worker()
        assert cluster.wait(30)
    finally:
        for sock in socks.values():
            sock.close()
        cluster.close()
        ctx.term()
    external = frozenset({(0, prompt.group_id)})
    assert_invariants(run_dir, epochs=2, groups=6, external=external)  # trained once, from worker-raw
