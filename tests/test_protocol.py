"""Every message round-trips; bad frames become ProtocolError with a precise code."""

from __future__ import annotations

import msgspec
import pytest

from prl_actors.protocol import MESSAGE_TYPES, PROTOCOL_VERSION, ProtocolError, decode, encode
from prl_actors.protocol import messages as m

pytestmark = pytest.mark.fast


def sample_messages() -> list[m.Msg]:
    group = m.Group(
        group_id=3,
        prompt="1+2=",
        prompt_ids=[5, 6],
        worker="worker-0",
        samples=[m.Sample(text="3", token_ids=[7], logprobs=[-0.1], reward=1.0)],
    )
    meta = m.TensorMeta(name="w", dtype="float32", shape=[2, 2], nbytes=16)
    return [
        m.Register(role="worker", pid=1, host="h"),
        m.Welcome(
            reply_to="x",
            run_id="r",
            mode="periodic",
            group_size=8,
            groups_per_epoch=4,
            heartbeat_interval_s=0.2,
            publisher_addr="tcp://a:1",
            buffer_addr="tcp://a:2",
        ),
        m.Heartbeat(busy_groups=[1]),
        m.HeartbeatAck(reply_to="x", known=False),
        m.Leave(reason="bye"),
        m.Ack(reply_to="x"),
        m.Error(code="malformed", detail="d"),
        m.EpochStart(groups=4, epoch=1, version=1),
        m.WorkRequest(max_groups=2),
        m.WorkAssign(reply_to="x", prompts=[m.Prompt(group_id=1, prompt="p", answer="a")]),
        m.NoWork(reply_to="x", reason="queue_empty"),
        m.EvalAssign(reply_to="x", epoch=2, version=2, prompts=[m.Prompt(group_id=1 << 20, prompt="1+2=")], samples=4),
        m.EvalResult(
            epoch=2,
            version=2,
            groups=[m.EvalGroup(prompt_id=1 << 20, prompt="1+2=", answer="3", completions=["3"], rewards=[1.0])],
        ),
        m.GroupResult(group=group, epoch=1, version=1),
        m.GroupAck(reply_to="x", group_id=3, accepted=False, reason="duplicate"),
        m.EpochOpen(groups=4),
        m.GroupAccepted(group_id=3, worker="worker-0"),
        m.GroupRefused(group_id=3, worker="worker-0", reason=m.RejectReason.NON_FINITE, detail="nan", expel=True),
        m.GiveBack(groups=[3, 4], error="generate: IndexError"),
        m.GroupDropped(group_id=3, reason="generate: IndexError"),
        m.Shutdown(reason="done"),
        m.Credit(n=2),
        m.TrainGroup(seq=0, group=group),
        m.EpochComplete(groups=4),
        m.EpochClose(groups=3, generated=7),
        m.StepDone(metrics={"reward_mean": 0.5}),
        m.WeightsBegin(tensors=[meta], total_bytes=16, chunks=1),
        m.WeightChunk(transfer="t", index=0, offset=0, nbytes=16),
        m.WeightsEnd(transfer="t"),
        m.WeightsStored(reply_to="x"),
        m.FetchWeights(),
        m.WeightsAvailable(version=2),
        m.StatusRequest(),
        m.Status(
            reply_to="x",
            state="running",
            mode="sync",
            groups_per_epoch=4,
            groups_done=1,
            groups_outstanding=2,
            epochs_total=5,
            members=[m.MemberInfo(name="w", role="worker", version=1, outstanding=1, last_seen_s=0.1)],
        ),
        m.Scale(workers=3),
        m.RequestStop(),
        m.EnvReset(env_id="CartPole-v1", owned=[0, 1], slots=[1], seeds=[7]),
        m.EnvObs(reply_to="x", slots=[1], arrays=[meta]),
        m.EnvStep(step=3, slots=[0, 1], arrays=[meta]),
        m.EnvStepResult(reply_to="x", step=3, slots=[0, 1], arrays=[meta, meta]),
        m.EnvAct(env_id="CartPole-v1", owned=[0], slots=[0], seeds=[-1], steps=32, epoch=2, version=2),
        m.Segment(slots=[0], steps=32, episode_returns=[9.0], episode_lengths=[9], arrays=[meta], epoch=2, version=1),
        m.PolicyCheck(arrays=[meta], epoch=2, version=1),
        m.PolicyLogits(reply_to="x", arrays=[meta], epoch=3, version=3),
    ]


def test_every_type_has_a_sample() -> None:
    tags = {m.tag_of(msg) for msg in sample_messages()}
    assert tags == set(MESSAGE_TYPES)


@pytest.mark.parametrize("msg", sample_messages(), ids=lambda msg: m.tag_of(msg))
def test_round_trip(msg: m.Msg) -> None:
    payload = [b"\x00\x01raw"] if isinstance(msg, m.WeightChunk) else []  # only chunks carry raw frames
    decoded, payloads = decode(encode(msg, payload))
    assert decoded == msg
    assert [bytes(p) for p in payloads] == payload


def test_header_fields_are_typed_fields() -> None:
    raw = msgspec.msgpack.decode(encode(m.WorkRequest(sender="w", epoch=2, version=2))[0])
    assert raw["proto"] == PROTOCOL_VERSION and raw["type"] == "work_request"
    assert raw["epoch"] == 2 and raw["version"] == 2 and raw["sender"] == "w" and raw["id"]


def test_ids_are_unique() -> None:
    assert len({m.Ack(reply_to="").id for _ in range(1000)}) == 1000


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([], "malformed"),
        ([b"\xc1 not msgpack"], "malformed"),
        ([msgspec.msgpack.encode([1, 2, 3])], "malformed"),
        ([msgspec.msgpack.encode({"proto": 99, "type": "register", "id": "a"})], "bad_protocol"),
        ([msgspec.msgpack.encode({"type": "register"})], "bad_protocol"),
        ([msgspec.msgpack.encode({"proto": PROTOCOL_VERSION, "type": "launch_missiles"})], "unknown_type"),
        ([msgspec.msgpack.encode({"proto": PROTOCOL_VERSION, "type": "register"})], "malformed"),
        ([msgspec.msgpack.encode({"proto": PROTOCOL_VERSION, "type": "credit", "n": "many"})], "malformed"),
    ],
)
def test_bad_frames(frames: list[bytes], code: str) -> None:
    with pytest.raises(ProtocolError) as err:
        decode(frames)
    assert err.value.code == code
    assert err.value.detail


def test_bad_protocol_error_keeps_request_id() -> None:
    frame = msgspec.msgpack.encode({"proto": 7, "type": "register", "id": "req-1", "sender": "w"})
    with pytest.raises(ProtocolError) as err:
        decode([frame])
    assert (err.value.reply_to, err.value.sender) == ("req-1", "w")
    assert "7" in err.value.detail
