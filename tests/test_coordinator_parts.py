"""The coordinator's parts alone (no sockets): EpochWork's exactly-once rules and fair share, membership,
the phase machine."""

from __future__ import annotations

import pytest

from prl_actors.coordinator.epoch_work import Accept, EpochWork
from prl_actors.coordinator.phase import IllegalTransition, PhaseMachine
from prl_actors.protocol import messages as m
from prl_actors.runtime.membership import Membership

pytestmark = pytest.mark.fast

# --- EpochWork: the exactly-once rules ----------------------------------------------------------


def test_epoch_work_hands_out_each_group_once_and_requeues_a_leaver_first() -> None:
    work = EpochWork([0, 1, 2, 3])
    assert work.assign("a", 2) == [0, 1] and work.assign("b", 5) == [2, 3] and work.assign("a", 1) == []
    assert work.release("a") == [0, 1]
    assert list(work.queue) == [0, 1] and work.held_by("a") == [] and work.held_by("b") == [2, 3]
    assert work.assign("b", 1) == [0]


def test_epoch_work_a_done_group_is_never_handed_out_again() -> None:
    work = EpochWork([0, 1])
    work.assign("a", 2)
    assert work.release("a") == [0, 1]  # a went silent: both queued again
    assert work.accept(0) == (Accept.NEW, None)  # ... but a's group 0 reached the buffer after all
    assert list(work.queue) == [1]
    assert work.accept(0) == (Accept.ALREADY, None)
    assert work.assign("b", 5) == [1] and not work.complete
    assert work.accept(1) == (Accept.NEW, "b") and work.complete


def test_fair_share_keeps_a_slower_workers_share_but_never_starves_anyone() -> None:
    work = EpochWork(list(range(16)))
    assert work.fair_share("a", workers=1) == 16  # alone: everything
    assert work.fair_share("a", workers=2) == 8
    work.assign("a", 8)
    assert work.fair_share("a", workers=2) == 0  # b's half waits for b
    assert work.fair_share("b", workers=2) == 8
    work.accept(0)
    work.accept(1)  # a finished two: its share grows back
    assert work.fair_share("a", workers=2) == 1
    work.assign("b", 8)
    assert work.fair_share("c", workers=3) == 0  # nothing queued
    for g in range(2, 16):
        work.accept(g)
    assert work.complete


def test_fair_share_lets_a_worker_holding_nothing_take_queued_work() -> None:
    work = EpochWork([0, 1, 2])
    work.assign("a", 1)
    assert work.fair_share("b", workers=5) == 1  # ceil(3 / 5) = 1


def test_epoch_work_waiting_workers_are_nudged_once() -> None:
    work = EpochWork([0])
    work.assign("a", 1)
    work.waiting |= {"b", "c"}
    work.release("a")
    assert work.take_waiting() == ["b", "c"] and work.take_waiting() == []


# --- Membership and the phase machine ------------------------------------------------------------


def test_membership_liveness_and_roles() -> None:
    members = Membership()
    members.join("worker-b", m.Role.WORKER, b"b", now=0.0)
    members.join("worker-a", m.Role.WORKER, b"a", now=0.0)
    members.join("buffer", m.Role.BUFFER, b"buf", now=0.0)
    members.seen("worker-a", 2.0)
    members.seen("buffer", 2.0)
    assert [x.name for x in members.silent(2.5, timeout_s=1.0)] == ["worker-b"]
    assert [x.name for x in members.of_role(m.Role.WORKER)] == ["worker-a", "worker-b"]
    assert members.first(m.Role.BUFFER).identity == b"buf"  # type: ignore[union-attr]
    assert members.remove("worker-b") is not None and "worker-b" not in members and len(members) == 2


def test_phase_machine_refuses_illegal_transitions() -> None:
    phase = PhaseMachine()
    with pytest.raises(IllegalTransition):
        phase.to(m.Phase.RUNNING)  # no epoch opens without the buffer's ack
    for p in (m.Phase.OPENING, m.Phase.RUNNING, m.Phase.TRAINING, m.Phase.OPENING, m.Phase.WAITING_WEIGHTS):
        phase.to(p)
    phase.to(m.Phase.DONE)
    with pytest.raises(IllegalTransition):
        phase.to(m.Phase.OPENING)
