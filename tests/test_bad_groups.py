"""Issue 23: a bad group, prompt or plugin never stops a run (the cores, driven without sockets).

The buffer refuses malformed groups with a reason and has the coordinator requeue them; a worker
refused run.max_bad_groups times is expelled; a worker whose engine or reward fails gives its
groups back at once; a group that keeps failing ends the run with its cause; a group held past
its deadline is taken back from a live worker; the trainer never loses the honest groups of a
failed forward and never steps on a non-finite gradient.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from prl_actors.buffer.core import BufferCore
from prl_actors.buffer.group_check import GroupChecker
from prl_actors.launch import build
from prl_actors.protocol import messages as m
from prl_actors.protocol import tickets
from prl_actors.records.logs import EventLog
from prl_actors.records.rundir import RunDir
from prl_actors.replay.coordinator_replay import decode_input
from prl_actors.tasks.base import Task, exact_match
from prl_actors.trainer.core import TrainerCore
from tests.test_epoch_protocol import KEY, FailingEngine, coordinator, drive, inbound, open_epoch, request_work, worker

G, TOKENS, ARMS = 2, 3, 8


def honest(gid: int, epoch: int = 0, worker_name: str = "worker-w", prompt: str = "ctx 1") -> m.GroupResult:
    """A group as the sim engine makes it: text = the first id, TOKENS ids, the context as prompt id."""
    samples = [m.Sample(text=str(a), token_ids=[a] * TOKENS, logprobs=[-1.0] * TOKENS, reward=1.0) for a in (4, 5)]
    group = m.Group(group_id=gid, prompt=prompt, prompt_ids=[1], samples=samples, worker=worker_name)
    ticket = tickets.mint(KEY, epoch, gid, worker_name)
    return m.GroupResult(epoch=epoch, version=epoch, group=group, ticket=ticket)


def checked_buffer(max_bad: int = 0) -> BufferCore:
    checker = GroupChecker(
        vocab_size=ARMS,
        max_response_tokens=TOKENS,
        prompt_of=lambda epoch, gid: m.Prompt(group_id=gid, prompt="ctx 1", answer="4"),
        encode=lambda text: [int(text.split()[-1])],
        decode=lambda ids: str(ids[0]) if ids else "",
    )
    core = BufferCore("buffer", EventLog("buffer", "buffer"), "periodic", G, 100, checker, max_bad)
    core.handle(0.0, inbound(m.EpochOpen(epoch=0, version=0, groups=4, ticket_key=KEY), "coordinator", "coordinator"))
    core.handle(0.0, inbound(m.Credit(n=10), "trainer"))
    core.outbox.clear()
    return core


def send(core: BufferCore, msg: m.GroupResult) -> tuple[m.GroupAck, list[m.Msg]]:
    core.handle(0.0, inbound(msg, msg.group.worker))
    out, core.outbox = [x for _, x, _ in core.outbox], []
    (ack,) = [x for x in out if isinstance(x, m.GroupAck)]
    return ack, [x for x in out if not isinstance(x, m.GroupAck)]


def spoil(msg: m.GroupResult, **sample: object) -> m.GroupResult:
    first = msg.group.samples[0]
    msg.group.samples = [
        m.Sample(**{**{f: getattr(first, f) for f in first.__struct_fields__}, **sample}),
        *msg.group.samples[1:],
    ]
    return msg


def test_the_buffer_refuses_malformed_groups_with_a_reason_and_has_them_requeued() -> None:
    core = checked_buffer()
    long_ids = [4] * (TOKENS + 1)
    cases = {
        "non_finite": spoil(honest(0), reward=math.nan),
        "bad_tokens": spoil(honest(0), token_ids=[4, 4, 10**6]),
        "too_long": spoil(honest(0), token_ids=long_ids, logprobs=[-1.0] * len(long_ids)),
        "bad_text": spoil(honest(0), text="\x00garbage"),
        "bad_group_size": honest(0),
    }
    cases["bad_group_size"].group.samples = cases["bad_group_size"].group.samples * 2
    wrong = honest(0)
    wrong.group.prompt = "ctx 2"
    cases["wrong_prompt"] = wrong
    ids = honest(0)
    ids.group.prompt_ids = [3]
    cases["wrong_prompt_ids"] = ids
    for want, msg in cases.items():
        ack, out = send(core, msg)
        assert (ack.accepted, str(ack.reason)) == (False, want.replace("_ids", "")), want
        (refused,) = out  # nothing streamed to the trainer; the coordinator is told to requeue it
        assert isinstance(refused, m.GroupRefused) and refused.group_id == 0 and refused.reason == ack.reason
        assert refused.detail and not refused.expel
    ack, out = send(core, honest(0))
    assert ack.accepted and [m.tag_of(x) for x in out] == ["group_accepted", "train_group"]
    assert core.bad == {"worker-w": len(cases)}


def test_a_worker_refused_max_bad_groups_times_is_expelled_by_buffer_and_coordinator() -> None:
    buf = checked_buffer(max_bad=2)
    _, (first,) = send(buf, spoil(honest(0), reward=math.inf))
    _, (second,) = send(buf, spoil(honest(1), reward=math.nan))
    assert not first.expel and second.expel
    ack, out = send(buf, honest(2))  # an honest-looking group from it is refused from now on
    assert (ack.accepted, ack.reason) == (False, "expelled") and out == []

    coord = coordinator()
    open_epoch(coord)
    assign = request_work(coord, "worker-a", 0)
    assert isinstance(assign, m.WorkAssign)
    gid = assign.prompts[0].group_id
    refused = m.GroupRefused(epoch=0, version=0, group_id=gid, worker="worker-a", reason=m.RejectReason.NON_FINITE)
    refused.expel = True
    sent = drive(coord, 0.2, refused, "buffer")
    assert coord.work.queue[0] == gid and "worker-a" not in coord.members  # requeued at once, member gone
    assert any(isinstance(x, m.Shutdown) and "expelled" in x.reason for _, x in sent)
    assert any("expelled worker-a" in n for n in coord.notices)
    (_, again), *_ = drive(coord, 0.3, m.Register(role=m.Role.WORKER), "worker-a")
    assert isinstance(again, m.Error) and "expelled" in again.detail


def test_a_run_whose_workers_were_all_expelled_ends_after_the_join_timeout_naming_why() -> None:
    """Expelled names cannot come back and `up` does not replace them: with none left, the run waited
    for good ("stalled: no worker is registered"). It now waits expelled_wait_s
    (transport.join_timeout_s) for a worker to join, then fails naming the expulsions."""
    coord = coordinator()
    open_epoch(coord)  # worker-a and worker-b
    assign = request_work(coord, "worker-a", 0)
    assert isinstance(assign, m.WorkAssign)
    refused = m.GroupRefused(
        epoch=0, version=0, group_id=assign.prompts[0].group_id, worker="worker-a",
        reason=m.RejectReason.WRONG_PROMPT, detail="prompt_ids are not the assigned prompt's tokenisation", expel=True,
    )  # fmt: skip
    drive(coord, 0.2, refused, "buffer")
    wait = coord.s.expelled_wait_s
    drive(coord, wait - 0.2, m.Register(role=m.Role.WORKER), "worker-c")  # a worker may still join ...
    coord.tick(wait + 0.5)  # ... (worker-b fell silent: gone)
    assert coord.phase.current == m.Phase.RUNNING and "worker-c" in coord.members
    coord.tick(wait + 1.5)  # worker-c silent too: removed ...
    coord.tick(wait + 1.6)  # ... none left, and none joined within `wait` of the expulsion
    assert coord.phase.current == m.Phase.DONE
    assert coord.done_reason.startswith("failed: no worker is left to generate the run's groups: worker-a expelled")
    assert "wrong_prompt: prompt_ids are not" in coord.done_reason and f"within {wait:g}s" in coord.done_reason


def test_a_group_refused_by_the_trainer_after_the_epoch_was_generated_is_generated_again() -> None:
    coord = coordinator()
    open_epoch(coord)
    for g in range(4):
        request_work(coord, "worker-a", 0)
        drive(coord, 0.2, m.GroupAccepted(epoch=0, version=0, group_id=g, worker="worker-a"), "buffer")
    assert coord.phase.current == m.Phase.TRAINING
    refused = m.GroupRefused(epoch=0, version=0, group_id=2, worker="worker-a", reason=m.RejectReason.TRAIN_FAILED)
    drive(coord, 0.3, refused, "buffer")
    assert coord.phase.current == m.Phase.RUNNING and list(coord.work.queue) == [2] and 2 not in coord.work.done
    assign = request_work(coord, "worker-b", 0, now=0.4)
    assert isinstance(assign, m.WorkAssign) and [p.group_id for p in assign.prompts] == [2]


def test_a_failing_engine_gives_its_groups_back_and_a_group_that_keeps_failing_ends_the_run_with_its_cause() -> None:
    w = worker(FailingEngine())
    from tests.test_epoch_protocol import assign

    (back,) = [x for x in assign(w) if isinstance(x, m.GiveBack)]
    coord = coordinator()
    open_epoch(coord)
    for i in range(3):  # run.max_group_failures = 3 (the default)
        got = request_work(coord, "worker-a", 0, now=0.1 + i)
        assert isinstance(got, m.WorkAssign)
        gid = got.prompts[0].group_id
        back = m.GiveBack(epoch=0, version=0, groups=[gid], error=back.error)
        drive(coord, 0.2 + i, back, "worker-a")
        if i < 2:
            assert coord.work.queue[0] == gid and gid not in coord.work.holder  # requeued at once
    assert coord.phase.current == m.Phase.DONE  # task.on_error fail_first: the first epoch fails the run
    assert "device lost" in coord.done_reason and f"group {gid}" in coord.done_reason
    assert coord.notices and "failed 3 times" in coord.notices[-1]


def test_a_scoring_failure_outside_the_reward_policy_gives_the_group_back_with_the_cause() -> None:
    """Reward errors follow task.on_reward_error (the rewards' own tests); anything else that raises
    while a finished group is scored (here the task's length penalty) gives the group back at once."""

    class Once(FailingEngine):
        def step(self) -> list:  # type: ignore[type-arg]
            from prl_actors.engines.base import Generated, GeneratedGroup

            self.busy = False
            return [GeneratedGroup(2, "ctx 1", [1], [Generated("4", [4], [-1.0])] * G)]

    w = worker(Once())

    def broken(length: int) -> float:
        raise ValueError("shaping broke")

    w.task.length_penalty = broken  # type: ignore[method-assign]
    from tests.test_epoch_protocol import assign

    out = assign(w)
    (back,) = [x for x in out if isinstance(x, m.GiveBack)]
    assert back.groups == [2] and "shaping broke" in back.error and "score" in back.error
    assert not any(isinstance(x, m.GroupResult) for x in out) and w.failure is None


def test_a_group_held_past_its_deadline_by_a_live_worker_is_taken_back_and_its_holder_named() -> None:
    coord = coordinator()
    coord.s.hold_min_s, coord.s.hold_factor = 5.0, 10.0
    coord.group_times.append(0.2)  # groups took 0.2 s so far: the deadline is its floor, 5 s
    open_epoch(coord)
    got = request_work(coord, "worker-a", 0, now=0.1)
    assert isinstance(got, m.WorkAssign)
    gid = got.prompts[0].group_id
    for now in (1.0, 3.0):
        drive(coord, now, m.Heartbeat(version=0), "worker-a")  # alive all along
        drive(coord, now, m.Heartbeat(version=0), "worker-b")
        drive(coord, now, m.Heartbeat(version=0), "buffer")
        coord.now = now
        coord.tick(now)
    assert coord.work.holder.get(gid) == "worker-a"
    assert "worker-a: 1" in coord._stall_reason()  # `stalled:` names who holds what
    for name in ("worker-a", "worker-b", "buffer"):
        drive(coord, 5.5, m.Heartbeat(version=0), name)
    coord.now = 5.5
    coord.tick(5.5)
    assert gid not in coord.work.holder and coord.work.queue[0] == gid


def test_a_non_finite_metric_in_a_step_done_decodes_in_replay() -> None:
    msg = {"type": "step_done", "proto": m.PROTOCOL_VERSION, "id": "x", "sender": "trainer", "epoch": 0}
    msg.update(version=1, metrics={"loss": None, "reward_mean": 0.5})
    decoded = decode_input({"msg": msg, "identity": "", "principal": ""}, {}).msg
    assert isinstance(decoded, m.StepDone) and math.isnan(decoded.metrics["loss"])


# --- the trainer: a failed forward loses no honest group; a non-finite step never happens -----------


@pytest.fixture(scope="module")
def grpo(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from prl_actors.engines.torch_engine import TorchEngine
    from tests.learning_utils import prompts, random_rewards, tiny_model

    cfg, model_dir = tiny_model(tmp_path_factory.mktemp("guard"), trainer__micro_batch_groups=4)
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    groups = random_rewards(engine.generate(prompts(["1+2=", "3+4=", "5+6=", "7+8=", "2+2=", "9+1="]), 4))
    return cfg, model_dir, groups


def trainer(cfg, model_dir: Path, run_dir: Path) -> TrainerCore:  # type: ignore[no-untyped-def]
    from prl_actors.launch.topology import learner_settings
    from prl_actors.training.grpo import GRPOLearner

    learner = GRPOLearner(learner_settings(cfg), model_dir)
    core = TrainerCore("trainer", EventLog("trainer", "trainer"), learner, RunDir(run_dir), 32, 1 << 20, 5.0)
    core.handle(0.0, inbound(m.EpochOpen(epoch=0, version=0, groups=6), "buffer", "buffer"))
    return core


def feed(core: TrainerCore, msg: m.Msg) -> None:
    """As ActorHost._run: an exception out of a handler is logged and the actor lives on."""
    try:
        core.handle(0.0, inbound(msg, "buffer", "buffer"))
        while core.deferred:
            core.deferred.pop(0)(0.0)
    except Exception:  # noqa: S110 - the host's behaviour: the handler error is logged, nothing else
        pass


def test_a_forward_that_raises_mid_epoch_loses_no_honest_group(grpo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg, model_dir, groups = grpo
    bad = groups[2]
    bad_group = m.Group(
        group_id=bad.group_id,
        prompt=bad.prompt,
        prompt_ids=bad.prompt_ids,
        samples=[m.Sample(text="x", token_ids=[10**6], logprobs=[-1.0], reward=1.0), *bad.samples[1:]],
        worker="worker-evil",
    )
    stream = [*groups[:2], bad_group, *groups[3:]]
    core = trainer(cfg, model_dir, tmp_path)
    for seq, g in enumerate(stream):
        feed(core, m.TrainGroup(epoch=0, version=0, seq=seq, group=g))
    feed(core, m.EpochComplete(epoch=0, version=0, groups=6))
    honest_tokens = sum(len(s.token_ids) for g in stream if g is not bad_group for s in g.samples)
    assert core.learner.stats.tokens == honest_tokens  # type: ignore[attr-defined]  # every honest group trained
    refused = [x for _, x, _ in core.outbox if isinstance(x, m.GroupRefused)]
    assert [(r.group_id, r.worker, r.reason) for r in refused] == [(bad.group_id, "worker-evil", "train_failed")]
    assert core.consumed == 5 and core.learner.version == 0  # the step waits for the regenerated group
    feed(core, m.TrainGroup(epoch=0, version=0, seq=6, group=bad))  # the group generated again, honestly
    feed(core, m.EpochComplete(epoch=0, version=0, groups=6))
    assert core.learner.version == 1 and core.failure is None


def test_a_non_finite_gradient_never_reaches_the_optimizer(grpo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg, model_dir, groups = grpo
    core = trainer(cfg, model_dir, tmp_path)
    with torch.no_grad():
        next(core.learner.policy.parameters()).fill_(math.nan)  # type: ignore[attr-defined]
    before = {k: v.clone() for k, v in core.learner.policy.state_dict().items()}  # type: ignore[attr-defined]
    for seq, g in enumerate(groups):
        feed(core, m.TrainGroup(epoch=0, version=0, seq=seq, group=g))
    feed(core, m.EpochComplete(epoch=0, version=0, groups=6))
    assert core.failure is not None and "loss nan" in core.failure and "no step taken" in core.failure
    assert core.learner.version == 0 and not (tmp_path / "checkpoints").exists()
    after = core.learner.policy.state_dict()  # type: ignore[attr-defined]
    assert all(torch.equal(before[k].nan_to_num(), after[k].nan_to_num()) for k in before)  # no step


def test_on_error_skip_drops_a_group_that_keeps_failing_and_the_epoch_trains_without_it() -> None:
    coord = coordinator()
    coord.s.on_error = "skip"
    open_epoch(coord)
    for i in range(3):
        got = request_work(coord, "worker-a", 0, now=0.1 + i)
        assert isinstance(got, m.WorkAssign) and got.prompts[0].group_id == 0
        out = drive(coord, 0.2 + i, m.GiveBack(epoch=0, version=0, groups=[0], error="IndexError: x"), "worker-a")
    (dropped,) = [x for _, x in out if isinstance(x, m.GroupDropped)]
    assert dropped.group_id == 0 and "IndexError" in dropped.reason and coord.phase.current == m.Phase.RUNNING
    assert any("dropped group 0" in n for n in coord.notices)
    for g in (1, 2, 3):
        request_work(coord, "worker-b", 0, now=5.0)
        drive(coord, 5.0, m.GroupAccepted(epoch=0, version=0, group_id=g, worker="worker-b"), "buffer")
    assert coord.phase.current == m.Phase.TRAINING  # the epoch is generated without group 0

    buf = checked_buffer()
    for g in (1, 2, 3):
        send(buf, honest(g))
    buf.handle(0.0, inbound(dropped, "coordinator", "coordinator"))
    out = [x for _, x, _ in buf.outbox]
    (complete,) = [x for x in out if isinstance(x, m.EpochComplete)]
    assert complete.groups == 3  # the trainer steps on the 3 groups it got
    ack, _ = send(buf, honest(0))
    assert (ack.accepted, ack.reason) == (False, "dropped")


def test_verify_rewards_refuses_a_group_whose_reported_rewards_differ() -> None:
    task = Task(items=[("ctx 1", "4")], reward=exact_match)
    checker = GroupChecker(prompt_of=lambda e, g: m.Prompt(group_id=g, prompt="ctx 1", answer="4"), score=task.score)
    msg = honest(0)  # samples "4" (right: 1.0) and "5" (wrong: 0.0), both reported as 1.0
    reason, detail = checker.check(0, msg.group) or (None, "")
    assert reason == m.RejectReason.REWARD_MISMATCH and "sample 1" in detail
    msg.group.samples[1].reward = 0.0
    assert checker.check(0, msg.group) is None


def test_the_assignment_deadline_follows_the_observed_group_times() -> None:
    coord = coordinator()
    coord.s.hold_factor, coord.s.hold_min_s = 10.0, 2.0
    assert coord.hold_deadline_s() == 20.0  # nothing timed yet: hold_factor x the floor
    coord.group_times.extend([0.1] * 95 + [1.0] * 5)
    assert coord.hold_deadline_s() == pytest.approx(10.0)  # 10 x p95 (1.0 s)
    coord.group_times.clear()
    coord.group_times.extend([0.01] * 100)
    assert coord.hold_deadline_s() == 2.0  # never below the floor


class Sink:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.rows: list[dict] = []  # type: ignore[type-arg]

    def warn(self, line: str) -> None:
        self.lines.append(line)

    def epoch_metrics(self, row) -> None:  # type: ignore[no-untyped-def]
        self.rows.append(dict(row))

    def save_checkpoint(self, version, write):  # type: ignore[no-untyped-def]
        return None

    def latest_checkpoint(self, on_skip=None):  # type: ignore[no-untyped-def]
        return None


def sim_trainer(sink: Sink) -> TrainerCore:
    from prl_actors.config import load_config
    from prl_actors.training.sim import SimLearner

    cfg = load_config(None, {"worker.engine": "sim", "trainer.learner": "sim", "sim.train_s_per_sample": 0.0})
    return TrainerCore(
        "trainer", EventLog("trainer", "trainer"), SimLearner(cfg.sim, cfg.run.seed), sink, 32, 1 << 20, 5.0
    )


def test_epochs_without_learning_signal_are_said_and_k_in_a_row_once_clearly() -> None:
    sink = Sink()
    core = sim_trainer(sink)
    for epoch in range(4):
        core.handle(0.0, inbound(m.EpochOpen(epoch=epoch, version=epoch, groups=2), "buffer", "buffer"))
        for gid in range(2):
            g = honest(gid, epoch).group
            for s in g.samples:
                s.reward = 0.0  # every sample equal: zero advantage
            core.handle(0.0, inbound(m.TrainGroup(epoch=epoch, version=epoch, seq=gid, group=g), "buffer", "buffer"))
        core.handle(0.0, inbound(m.EpochComplete(epoch=epoch, version=epoch, groups=2), "buffer", "buffer"))
        v = core.learner.version
        core.handle(0.0, inbound(m.WeightsStored(reply_to="u", version=v), "publisher", "publisher"))
    assert [r["zero_adv_share"] for r in sink.rows] == [1.0] * 4
    assert sum("had no learning signal" in line for line in sink.lines) == 2  # epochs 0 and 1
    (clear,) = [line for line in sink.lines if "3 epochs in a row without learning signal" in line]
    assert len(sink.lines) == 3  # then quiet: one clear line, not one per epoch


def test_an_unhandled_trainer_error_fails_the_actor_naming_the_message() -> None:
    from prl_actors.runtime.core import ActorHost

    core = sim_trainer(Sink())
    core.handle(0.0, inbound(m.EpochOpen(epoch=0, version=0, groups=1), "buffer", "buffer"))
    host = ActorHost.__new__(ActorHost)  # only _run's error path, without sockets
    host.core, host._heartbeat, host.error = core, None, None
    host._flush = lambda: None  # type: ignore[method-assign]
    host.stop = lambda: None  # type: ignore[method-assign]
    host._fail = lambda error: setattr(host, "error", error)  # type: ignore[method-assign]

    def boom(now: float) -> None:
        raise KeyError("a bug")

    host._run(boom, what="epoch_complete")
    assert host.error is not None and "failed handling epoch_complete: KeyError" in host.error


@pytest.mark.parametrize(
    ("family", "stop"), [("qwen2", []), ("llama", []), ("gpt2", []), ("mistral", []), ("qwen2", ["e", " "])]
)
def test_honest_torch_groups_pass_the_buffers_checks_for_every_model_family(
    tmp_path: Path, family_dirs: dict[str, Path], family: str, stop: list[str]
) -> None:
    """No false refusal: what the torch engine generates passes every check (an honest worker is
    never refused, let alone expelled), and a spoiled copy does not. With stop strings the text is
    cut before the stop while the tokens keep it (as vLLM does): still honest (a buffer that compared
    the text with the whole decoding refused every such group, and the run never finished)."""
    from prl_actors.config import load_config
    from prl_actors.engines.torch_engine import TorchEngine
    from prl_actors.launch import build
    from tests.learning_utils import to_group

    path = family_dirs[family]
    cfg = load_config(
        None,
        {
            "model.path": str(path),
            "run.run_dir": str(tmp_path),
            "worker.group_size": 4,
            "coordinator.groups_per_epoch": 3,
            "worker.sampling.stop": stop,
        },
    )
    prompts = build.task(cfg).prompts_for_epoch(0, 3)
    engine = TorchEngine(build.engine_settings(cfg), path)
    engine.version = 0
    checker = build.group_checker(cfg, path)
    for gen in engine.generate(prompts, 4):
        group = to_group(gen, lambda text: 0.0)
        assert checker.check(0, group) is None, (family, checker.check(0, group), checker.note)
        group.samples[0].text += " extra"
        reason, _ = checker.check(0, group) or (None, "")
        assert reason == m.RejectReason.BAD_TEXT
    assert checker.vocab_size > 0 and not checker.note


def test_a_multi_turn_sample_is_bounded_by_its_sampled_tokens_and_verify_rewards_is_refused() -> None:
    from prl_actors.config import load_config
    from prl_actors.sections import ConfigError

    checker = GroupChecker(vocab_size=50, max_response_tokens=4)
    mask = [1, 1, 0, 0, 0, 0, 1, 1]  # two model turns of 2 tokens around a 4-token observation
    episode = m.Sample(text="t", token_ids=[3] * 8, logprobs=[-1.0] * 4, reward=1.0, loss_mask=mask)
    group = m.Group(group_id=0, prompt="p", prompt_ids=[1], samples=[episode], worker="w")
    assert checker.check(0, group) is None  # 4 sampled tokens, one log-prob each; the env's are not bounded
    episode.logprobs = [-1.0] * 8
    assert (checker.check(0, group) or (None,))[0] == m.RejectReason.BAD_TOKENS
    episode.logprobs, episode.loss_mask = [-1.0] * 5, [1, 1, 1, 0, 0, 0, 1, 1]
    assert (checker.check(0, group) or (None,))[0] == m.RejectReason.TOO_LONG
    with pytest.raises(ConfigError, match="verify_rewards .* multi-turn"):
        load_config(None, {"task.name": "guess", "buffer.verify_rewards": True})
