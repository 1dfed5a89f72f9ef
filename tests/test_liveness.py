"""No silent hang, one member per name: the coordinator's watchdog in every state, and members that
give up (with a reason) instead of waiting forever for their coordinator. Cores only, no sockets."""

from __future__ import annotations

import pytest

from prl_actors.buffer.core import BufferCore
from prl_actors.coordinator.core import FIRST_WEIGHTS_GRACE_S, STALL_LOG_S, CoordinatorCore
from prl_actors.protocol import messages as m
from prl_actors.records.logs import EventLog
from prl_actors.runtime.core import Core
from prl_actors.transport.port import Inbound
from tests.test_epoch_protocol import B, coordinator, drive, open_epoch, request_work

pytestmark = pytest.mark.fast

JOIN_S = 5.0


def member(join_timeout_s: float = JOIN_S) -> BufferCore:
    core = BufferCore("buffer", EventLog("buffer", "buffer"), "periodic", 2, 16)
    core.join_timeout_s = join_timeout_s
    return core


def from_coordinator(core: Core, now: float, msg: m.Msg) -> None:
    msg.sender = "coordinator"
    core.now = now
    core.handle(now, Inbound(msg, [], peer="coordinator"))


def tick(core: Core, now: float) -> None:
    core.now = now
    core.tick(now)


# --- the coordinator's watchdog --------------------------------------------------------------------


def to_state(core: CoordinatorCore, state: m.Phase) -> None:
    if state == m.Phase.WAITING_WEIGHTS:
        return
    if state == m.Phase.OPENING:
        drive(core, 0.0, m.Register(role=m.Role.BUFFER), "buffer")
        drive(core, 0.0, m.WeightsAvailable(version=0), "publisher")
        return
    open_epoch(core)
    if state == m.Phase.TRAINING:
        for g in range(B):
            request_work(core, "worker-a", 0)
            drive(core, 0.1, m.GroupAccepted(epoch=0, version=0, group_id=g, worker="worker-a"), "buffer")


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (m.Phase.WAITING_WEIGHTS, "waiting for the trainer's weights"),
        (m.Phase.OPENING, "waiting for the buffer to ack epoch_open"),
        (m.Phase.RUNNING, "every worker still holds an older version"),
        (m.Phase.TRAINING, "waiting for the trainer's step of epoch 0 (weights v1"),
    ],
)
def test_the_watchdog_says_why_the_run_waits_in_every_state(state: m.Phase, reason: str) -> None:
    core = coordinator()
    core.s.request_timeout_s = core.s.heartbeat_timeout_s = 1000.0  # nothing times out meanwhile
    to_state(core, state)
    assert core.phase.current == state
    after = FIRST_WEIGHTS_GRACE_S if state == m.Phase.WAITING_WEIGHTS else STALL_LOG_S
    tick(core, 1.0)
    tick(core, 1.0 + after - 0.5)
    assert core.stall_reason == ""  # not yet
    tick(core, 1.0 + after + 0.5)
    assert reason in core.stall_reason


def test_a_run_resumed_from_its_last_checkpoint_completes_instead_of_waiting() -> None:
    core = coordinator(epochs=3)
    drive(core, 0.0, m.Register(role=m.Role.BUFFER), "buffer")
    drive(core, 0.0, m.WeightsAvailable(version=3), "publisher")  # v3: epochs 0..2 are all done
    assert core.phase.current == m.Phase.DONE and core.done_reason == "completed" and core.stopped


# --- one member per name ---------------------------------------------------------------------------


def register(core: CoordinatorCore, now: float, name: str, pid: int) -> m.Msg:
    (_, reply), *_ = drive(core, now, m.Register(role=m.Role.WORKER, pid=pid, host="h"), name)
    return reply


def test_a_name_held_by_a_live_process_is_refused_not_taken_over() -> None:
    core = coordinator()
    open_epoch(core)
    assert isinstance(register(core, 0.0, "worker-x", pid=1), m.Welcome)
    work = request_work(core, "worker-x", 0, now=0.1)
    assert isinstance(work, m.WorkAssign)
    intruder = register(core, 0.5, "worker-x", pid=2)  # another process, same name: a second `up`
    assert isinstance(intruder, m.Error) and "held by a live member (pid 1 on h)" in intruder.detail
    assert core.members.get("worker-x").pid == 1  # type: ignore[union-attr]
    assert core.work.held_by("worker-x") == [p.group_id for p in work.prompts]  # type: ignore[attr-defined]
    assert isinstance(register(core, 0.6, "worker-x", pid=1), m.Welcome)  # the same process may re-register
    assert isinstance(register(core, 5.0, "worker-x", pid=2), m.Welcome)  # the holder went silent: taken


def test_a_late_joiner_is_told_the_run_is_over() -> None:
    core = coordinator()
    open_epoch(core)
    drive(core, 0.2, m.RequestStop(reason="prl-actors stop"), "operator-cli")  # only the operator key may stop
    reply = register(core, 0.3, "worker-late", pid=9)
    assert isinstance(reply, m.Shutdown) and "the run is over (stop requested: prl-actors stop)" in reply.reason
    joiner = member()
    joiner.start(0.0)
    from_coordinator(joiner, 0.3, reply)
    assert joiner.stopped and joiner.failure is None  # a clean exit: there is nothing to join


# --- members do not wait forever -------------------------------------------------------------------


def test_a_joiner_whose_coordinator_never_answers_gives_up_with_a_reason() -> None:
    core = member()
    core.start(0.0)
    tick(core, JOIN_S - 0.1)
    assert not core.stopped
    tick(core, JOIN_S + 0.1)
    assert core.stopped and core.failure is not None
    assert f"no answer from the coordinator at the coordinator within {JOIN_S:g}s" in core.failure


def test_a_member_that_hears_nothing_from_its_coordinator_gives_up() -> None:
    core = member()
    core.start(0.0)
    (_, register_msg, _), *_ = core.outbox
    welcome = m.Welcome(
        reply_to=register_msg.id, run_id="r", mode="periodic", group_size=2, groups_per_epoch=B,
        heartbeat_interval_s=0.1, publisher_addr="p", buffer_addr="b",
    )  # fmt: skip
    from_coordinator(core, 1.0, welcome)
    from_coordinator(core, 2.0, m.HeartbeatAck(reply_to="x", known=True))
    tick(core, 2.0 + JOIN_S - 0.1)
    assert not core.stopped
    tick(core, 2.0 + JOIN_S + 0.1)
    assert core.failure is not None and "lost the coordinator" in core.failure


def test_a_refused_registration_fails_the_member() -> None:
    core = member()
    core.start(0.0)
    (_, register_msg, _), *_ = core.outbox
    refusal = m.Error(reply_to=register_msg.id, code=m.ErrorCode.REJECTED, detail="name 'buffer' is held by ...")
    from_coordinator(core, 0.1, refusal)
    assert core.failure == "the coordinator refused to register buffer: name 'buffer' is held by ..."


def test_weights_that_overtake_the_last_accepted_group_still_open_the_next_epoch() -> None:
    """The trainer can step and publish v_{e+1} before the buffer's last GroupAccepted reaches the
    coordinator (seen under load): the epoch must open when that last accept arrives, not stall."""
    core = coordinator(epochs=3)
    open_epoch(core)
    for _ in range(B):
        request_work(core, "worker-a", 0)
    for g in range(B - 1):
        drive(core, 0.1, m.GroupAccepted(epoch=0, version=0, group_id=g, worker="worker-a"), "buffer")
    drive(core, 0.2, m.WeightsAvailable(version=1), "publisher")  # first: the step's weights
    drive(core, 0.2, m.StepDone(epoch=0, version=1), "trainer")
    out = drive(core, 0.3, m.GroupAccepted(epoch=0, version=0, group_id=B - 1, worker="worker-a"), "buffer")
    assert [(x.epoch, x.version) for _, x in out if isinstance(x, m.EpochOpen)] == [(1, 1)]
    assert core.phase.current == m.Phase.OPENING


def test_the_wait_for_the_first_weights_is_no_stall_until_the_grace_ends() -> None:
    """A normal start waits for the trainer's first weights while it starts and loads the model: no
    `stalled:` line for that wait up to FIRST_WEIGHTS_GRACE_S (later waits: STALL_LOG_S); then the
    reason says whether a trainer registered at all."""
    for trainer, reason in ((True, "(publisher: weights_available)"), (False, "no trainer has registered")):
        core = coordinator()
        core.s.request_timeout_s = core.s.heartbeat_timeout_s = 1000.0
        if trainer:
            drive(core, 0.0, m.Register(role=m.Role.TRAINER), "trainer")
        tick(core, 1.0)
        tick(core, 1.0 + 3 * STALL_LOG_S)
        assert core.stall_reason == ""
        tick(core, 1.0 + FIRST_WEIGHTS_GRACE_S + 0.5)
        assert reason in core.stall_reason
