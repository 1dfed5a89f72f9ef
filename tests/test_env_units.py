"""The classic-RL parts without sockets: typed arrays, the slot table, rounds, the KL estimator, the
AAPS rule, and the learner core's loss rules driven by hand (fake env actors answer from SyncVectorEnv)."""

from __future__ import annotations

import numpy as np
import pytest

from prl_actors.classic.envkit.arrays import ArrayError, pack, unpack
from prl_actors.classic.envkit.local import SlotEnvs
from prl_actors.classic.envkit.rounds import Received, RoundBook
from prl_actors.classic.envkit.slots import SlotTable
from prl_actors.classic.learner import LearnerCore
from prl_actors.classic.learner_acting import LearnerSettings
from prl_actors.protocol import messages as m
from prl_actors.records.logs import EventLog
from prl_actors.transport.port import Inbound

# --- typed arrays ------------------------------------------------------------------------------


def test_arrays_round_trip_keeps_dtype_and_shape() -> None:
    arrays = {"obs": np.arange(12, dtype=np.float32).reshape(3, 4), "done": np.array([True, False, True])}
    metas, frames = pack(arrays)
    back = unpack(metas, [bytes(f) for f in frames], required=["obs", "done"])
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v)


@pytest.mark.parametrize(
    "mutate, why",
    [
        (lambda metas, frames: (metas, frames[:1]), "payload frames"),
        (lambda metas, frames: (metas, [frames[0][:-1], frames[1]]), "bytes"),
        (
            lambda metas, frames: ([m.TensorMeta(name="obs", dtype="object", shape=[1], nbytes=8), metas[1]], frames),
            "dtype",
        ),
        (
            lambda metas, frames: ([m.TensorMeta(name="obs", dtype="float32", shape=[-1], nbytes=4), metas[1]], frames),
            "negative",
        ),
    ],
)
def test_arrays_that_do_not_match_their_description_are_refused(mutate, why) -> None:  # type: ignore[no-untyped-def]
    metas, frames = pack({"obs": np.zeros((2, 2), np.float32), "r": np.zeros(2)})
    bad_metas, bad_frames = mutate(metas, [bytes(f) for f in frames])
    with pytest.raises(ArrayError, match=why):
        unpack(bad_metas, bad_frames)


def test_missing_required_array_is_refused() -> None:
    metas, frames = pack({"obs": np.zeros(2)})
    with pytest.raises(ArrayError, match="missing arrays: reward"):
        unpack(metas, frames, required=["obs", "reward"])


# --- slots and rounds --------------------------------------------------------------------------


def test_slot_table_places_orphans_on_the_least_loaded_and_rebalances_only_when_uneven() -> None:
    t = SlotTable(5)
    assert t.assign_all(["b", "a"], [10, 11, 12, 13, 14]) == {"a": [0, 1, 2], "b": [3, 4]}
    assert t.drop("a") == [0, 1, 2] and t.orphans() == [0, 1, 2]
    assert t.place(["b", "c"]) == {"c": [0, 1], "b": [2]}
    assert t.reset_seed(0) == 10 + 5  # placed once anew: seed + N
    assert t.rebalance(4, ["b", "c"]) is None  # b has 3, c has 2: not uneven enough
    t.place([])
    assert t.rebalance(3, ["b", "c", "d"]) == "d" and t.owned("d") == [3]


def _seg(actor: str, slots: list[int]) -> Received:
    return Received(actor, slots, 0, {}, [], [], -1.0, False)


def test_round_book_takes_each_slot_once_received_or_lost() -> None:
    book = RoundBook()
    book.open(2, 2, {"a": [0, 1], "b": [2], "c": []})
    assert "not the open round" in (book.refusal(1, "a", [0, 1]) or "")
    assert "not a's slots" in (book.refusal(2, "a", [0]) or "")
    assert "owns no slot" in (book.refusal(2, "c", []) or "")
    book.receive(_seg("a", [0, 1]))
    assert "already sent" in (book.refusal(2, "a", [0, 1]) or "")
    assert book.lose("a") == [] and not book.complete  # already received: nothing lost
    assert book.lose("b") == [2] and book.complete
    batch = book.take()
    assert [s.actor for s in batch.segments] == ["a"] and batch.lost_slots == [2] and not book.is_open


# --- AAPS --------------------------------------------------------------------------------------


def test_kl_estimate_averages_per_env_then_over_envs() -> None:
    from prl_actors.classic.envkit.policy import kl_estimate

    same = np.zeros((6, 2), np.float32)
    assert kl_estimate(same, same, n_envs=2) == 0.0
    actor = np.log(np.array([[0.5, 0.5], [0.9, 0.1]] * 3, dtype=np.float32))  # rows env-minor: env0, env1, ...
    learner = np.log(np.array([[0.9, 0.1], [0.9, 0.1]] * 3, dtype=np.float32))
    kl0 = 0.5 * np.log(0.5 / 0.9) + 0.5 * np.log(0.5 / 0.1)  # env 0's KL on each of its 3 observations; env 1: 0
    assert kl_estimate(actor, learner, n_envs=2) == pytest.approx(kl0 / 2, rel=1e-5)
    doubled = kl_estimate(
        np.concatenate([actor, actor], 1).reshape(-1, 2), np.concatenate([learner, learner], 1).reshape(-1, 2), 4
    )
    assert doubled == pytest.approx(kl0 / 2, rel=1e-5)  # more envs, same estimate (a sum would double)


def test_should_fetch_rule() -> None:
    from prl_actors.classic.envkit.acting import should_fetch

    assert should_fetch(0.0, 0.0, held=3, offered=4)  # threshold 0 syncs on every new version
    assert not should_fetch(0.0, 1.0, held=4, offered=4)  # nothing new
    assert not should_fetch(0.1, 0.05, held=3, offered=4) and should_fetch(0.1, 0.2, held=3, offered=4)


def test_slot_envs_autoreset_step_is_marked_invalid() -> None:
    envs = SlotEnvs()
    envs.own("CartPole-v1", [7])
    envs.reset([7], [0])
    valid, done = [], False
    while not done:
        _, _, term, trunc, v = envs.step([7], np.array([0]))
        valid.append(bool(v[0]))
        done = bool(term[0] or trunc[0])
    _, reward, term, trunc, v = envs.step([7], np.array([0]))
    assert all(valid) and not v[0] and reward[0] == 0.0 and not (term[0] or trunc[0])
    assert len(envs.drain_finished()) == 1


# --- the learner core, by hand -----------------------------------------------------------------


class FakeActors:
    """Answers the learner core's EnvReset / EnvStep from real SlotEnvs, one per fake actor."""

    def __init__(self, core: LearnerCore, names: list[str]) -> None:
        self.core, self.envs = core, {n: SlotEnvs() for n in names}
        for n in names:
            self.deliver(0.0, m.Register(role=m.Role.ENV), n)

    def deliver(self, now: float, msg: m.Msg, sender: str, payloads: list | None = None) -> None:
        msg.sender = sender
        self.core.now = now
        self.core.handle(now, Inbound(msg, payloads or [], identity=sender.encode()))

    def pump(self, now: float, dead: frozenset[str] = frozenset()) -> list[tuple[str, m.Msg]]:
        """Answer every request in the core's outbox (requests to `dead` actors are dropped)."""
        seen = []
        while self.core.outbox:
            out, self.core.outbox = self.core.outbox, []
            for dest, msg, frames in out:
                who = dest.identity.decode()
                seen.append((who, msg))
                if who not in dead:
                    self._answer(now, who, msg, frames)
        return seen

    def _answer(self, now: float, who: str, msg: m.Msg, frames: list) -> None:
        env = self.envs[who]
        if isinstance(msg, m.EnvReset):
            env.own(msg.env_id, msg.owned)
            metas, out = pack({"obs": env.reset(msg.slots, msg.seeds)})
            self.deliver(now, m.EnvObs(reply_to=msg.id, slots=msg.slots, arrays=metas), who, list(out))
        elif isinstance(msg, m.EnvStep):
            actions = unpack(msg.arrays, frames)["actions"]
            obs, r, te, tr, _ = env.step(msg.slots, actions)
            metas, out = pack({"obs": obs, "reward": r, "terminated": te, "truncated": tr})
            self.deliver(
                now, m.EnvStepResult(reply_to=msg.id, step=msg.step, slots=msg.slots, arrays=metas), who, list(out)
            )


def learner(n: int = 4) -> LearnerCore:
    s = LearnerSettings("r", "remote", "CartPole-v1", n, (4,), "float32", "inproc://x", heartbeat_timeout_s=1.0)
    return LearnerCore("learner", EventLog("learner", "learner"), s)


def test_actor_lost_between_calls_truncates_at_the_next_step_then_resets_elsewhere() -> None:
    core = learner()
    actors = FakeActors(core, ["env-a", "env-b"])
    results: list = []
    core.call_reset(0.0, [0, 1, 2, 3], results.append)
    actors.pump(0.0)
    assert core.slots.owned("env-b") == [2, 3] and results[0][0].shape == (4, 4)
    actors.deliver(1.0, m.Heartbeat(), "env-a")
    core.tick(1.6)  # env-b silent for 1.6 s > 1.0: lost while no call is in flight
    assert core.slots.owned("env-a") == [0, 1, 2, 3]
    core.call_step(1.6, np.array([0, 1, 0, 1]), results.append)
    sent = actors.pump(1.6, dead=frozenset({"env-b"}))
    obs, reward, term, trunc, infos = results[1]
    assert list(trunc) == [False, False, True, True] and list(infos["env_lost"]) == [False, False, True, True]
    assert np.array_equal(obs[2:], results[0][0][2:])  # at their last observation
    assert not any(isinstance(msg, m.EnvStep) and 2 in msg.slots for _, msg in sent)  # nothing stepped for them
    core.call_step(1.7, np.array([0, 1, 0, 1]), results.append)
    sent = actors.pump(1.7)
    resets = [msg for who, msg in sent if who == "env-a" and isinstance(msg, m.EnvReset)]
    assert resets and resets[0].slots == [2, 3] and resets[0].seeds == [2 + 4, 3 + 4]  # reset on env-a, reseeded
    assert "env_lost" not in results[2][4] and list(results[2][3]) == [False] * 4 and list(results[2][1][2:]) == [0, 0]


def test_slot_due_for_autoreset_when_its_actor_is_lost_is_reset_elsewhere_in_the_same_step() -> None:
    core = learner(2)
    actors = FakeActors(core, ["env-a", "env-b"])
    results: list = []
    core.call_reset(0.0, [0, 1], results.append)
    actors.pump(0.0)
    core.in_episode[1] = False  # as if slot 1's episode ended at the previous step
    core.call_step(0.1, np.array([0, 0]), results.append)
    actors.pump(0.1, dead=frozenset({"env-b"}))  # env-b never answers (its step would have been the autoreset)
    actors.deliver(1.1, m.Heartbeat(), "env-a")
    core.tick(1.2)  # ... and is declared lost: the reset goes to env-a within this call
    actors.pump(1.2)
    obs, reward, term, trunc, infos = results[1]
    assert "env_lost" not in infos and not trunc[1] and reward[1] == 0.0  # a reset, not a truncation
    assert core.slots.owner == ["env-a", "env-a"]


def test_env_actor_exits_when_the_learner_is_gone() -> None:
    from prl_actors.classic.env_actor import EnvActorSettings, EnvCore

    core = EnvCore("env-0", EventLog("env-0", "env"), SlotEnvs(), EnvActorSettings(learner_timeout_s=1.0))
    core.start(0.0)
    core.handle(0.5, Inbound(m.HeartbeatAck(reply_to="x", sender="learner"), [], peer="learner"))
    core.tick(1.4)
    assert not core.stopped  # heard 0.9 s ago
    core.tick(1.6)
    assert core.stopped


def _segment_arrays(t: int, slots: list[int]) -> tuple[list, list]:
    n = len(slots)
    arrays = {
        "obs": np.zeros((t, n, 4), np.float32),
        "actions": np.zeros((t, n), np.int64),
        "logprobs": np.zeros((t, n), np.float32),
        "rewards": np.ones((t, n), np.float32),
        "terminated": np.zeros((t, n), bool),
        "truncated": np.zeros((t, n), bool),
        "valid": np.ones((t, n), bool),
        "next_obs": np.zeros((n, 4), np.float32),
    }
    metas, frames = pack(arrays)
    return metas, list(frames)


def test_acting_round_refuses_foreign_segments_and_times_out_a_stalled_actor() -> None:
    from prl_actors.weights.transfer import Snapshot

    s = LearnerSettings("r", "acting", "CartPole-v1", 4, (4,), "float32", "x", heartbeat_timeout_s=100.0)
    s.steps_per_segment, s.wait_actors, s.round_timeout_s = 2, 2, 5.0
    core = LearnerCore("learner", EventLog("learner", "learner"), s)
    actors = FakeActors(core, ["env-a", "env-b"])
    batches: list = []
    core.next_round(0.0, batches.append)
    core.publish(0.0, 0, Snapshot.from_tensors(0, {"w": np.zeros(2, np.float32)}), lambda obs: obs[:, :2])
    acts = {who: msg for who, msg in actors.pump(0.0) if isinstance(msg, m.EnvAct)}
    assert acts["env-a"].owned == [0, 2] and acts["env-b"].owned == [1, 3] and acts["env-a"].epoch == 0
    metas, frames = _segment_arrays(2, [1, 3])  # env-a claims env-b's slots: refused, nothing taken
    actors.deliver(0.1, m.Segment(slots=[1, 3], steps=2, arrays=metas, epoch=0, version=0), "env-a", frames)
    (reply,) = [msg for _, msg, _ in core.outbox]
    core.outbox.clear()
    assert isinstance(reply, m.Error) and "not env-a's slots" in reply.detail and not core.book.received
    metas, frames = _segment_arrays(2, [0, 2])
    actors.deliver(0.2, m.Segment(slots=[0, 2], steps=2, arrays=metas, epoch=0, version=0), "env-a", frames)
    core.tick(1.0)
    assert not batches  # env-b's segment is still out
    core.tick(5.5)  # env-b acts no more: lost after round_timeout_s, the round completes without it
    (batch,) = batches
    assert [seg.actor for seg in batch.segments] == ["env-a"] and batch.lost_slots == [1, 3]
    assert "env-b" not in core.members


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["actor", "env"], "need a config with an `env` section"),
        (["actor", "learner", "--set", "env.mode=remote", "--name", "env-1"], "must start with its role"),
        (["up", "--set", "env.mode=turbo"], "env.mode"),
        (["up", "--set", "env.sync_kl_threshold=-1"], "env.sync_kl_threshold"),
        (
            ["up", "--set", "env.num_envs=1", "--set", "env.ppo.num_minibatches=64", "--set", "env.ppo.num_steps=2"],
            "num_minibatches",
        ),
    ],
)
def test_env_cli_mistakes_get_one_clear_line(args: list[str], needle: str) -> None:
    from typer.testing import CliRunner

    from prl_actors.cli.main import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "Traceback" not in result.output and needle in result.output


def test_a_busy_learner_port_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import zmq

    from prl_actors.classic.envs.hub import EnvUnavailable, Hub
    from prl_actors.launch.classic import learner_settings
    from tests.env_utils import env_config

    cfg = env_config(tmp_path, transport="tcp")
    ctx = zmq.Context()
    squatter = ctx.socket(zmq.ROUTER)
    squatter.bind(cfg.address("learner"))
    try:
        with pytest.raises(EnvUnavailable, match="Address already in use"):
            Hub(learner_settings(cfg))
    finally:
        ctx.destroy(linger=0)


def test_a_hub_closed_under_a_busy_core_keeps_its_context(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Destroying the context closes the core's sockets under its live thread (libzmq aborts the
    process); a core that has not stopped in time keeps it, and a later close ends both."""
    import threading

    from prl_actors.classic.envs.hub import Hub
    from prl_actors.launch.classic import learner_settings
    from tests.env_utils import env_config

    hub = Hub(learner_settings(env_config(tmp_path)))
    release = threading.Event()
    try:
        hub.tell(lambda now: release.wait(30))  # the core's thread is busy
        hub.close(timeout_s=0.3)
        assert not hub.host.done.is_set() and not hub.ctx.closed
    finally:
        release.set()
    assert hub.host.done.wait(10)
    hub.close()
    assert hub.ctx.closed
