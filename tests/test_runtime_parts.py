"""The parts every actor's Core is composed of, each on its own (no sockets, no actor):
dispatch, refusal counts, trust, requests with timeouts, the membership client, the lifecycle; the
handler tables against the routes."""

from __future__ import annotations

import pytest

from prl_actors.protocol import messages as m
from prl_actors.protocol.routes import HOPS, receivable, senders_of
from prl_actors.publisher.core import PublisherCore
from prl_actors.records.logs import EventLog
from prl_actors.runtime.core import Core
from prl_actors.runtime.dispatch import handler_table, handles, missing_handlers
from prl_actors.runtime.lifecycle import Lifecycle
from prl_actors.runtime.member_client import MembershipClient
from prl_actors.runtime.refusals import LOUD_EVERY, LOUD_FIRST, VERDICTS_KEPT, Counters, Trust
from prl_actors.runtime.requests import Requests
from prl_actors.transport.port import Inbound
from prl_actors.worker.core import WorkerCore

pytestmark = pytest.mark.fast


class Base:
    @handles(m.Ack)
    def on_ack(self, now: float, inbound: Inbound[m.Ack]) -> None: ...

    @handles(m.Error)
    def on_error(self, now: float, inbound: Inbound[m.Error]) -> None: ...


class Sub(Base):
    def on_ack(self, now: float, inbound: Inbound[m.Ack]) -> None: ...  # overridden by name: still Ack's

    @handles(m.Error)
    def on_error_here(self, now: float, inbound: Inbound[m.Error]) -> None: ...


def test_dispatch_collects_handlers_over_bases_and_subclasses_win() -> None:
    table = handler_table(Sub)
    assert table == {m.Ack: "on_ack", m.Error: "on_error_here"}
    receives: list[type[m.Msg]] = [m.Ack, m.Shutdown]
    assert missing_handlers(table, frozenset(receives)) == [m.Shutdown]


def test_refusal_counts_sum_into_refused_and_their_log_lines_are_rate_limited() -> None:
    c = Counters()
    louds = [c.loud("refused.forbidden") for _ in range(2 * LOUD_EVERY)]
    assert c.counts["refused.forbidden"] == 2 * LOUD_EVERY and c.refused == 2 * LOUD_EVERY
    assert sum(louds) == LOUD_FIRST + 2 and louds[LOUD_EVERY - 1] and louds[2 * LOUD_EVERY - 1]  # 1..50, 1000th, 2000th
    c.count("request_timeout")  # not a refusal
    assert c.refused == 2 * LOUD_EVERY


def inbound(msg: m.Msg, who: str, peer: str | None = None, identity: bytes = b"") -> Inbound[m.Msg]:
    return Inbound(msg=msg, payloads=[], peer=peer, identity=identity, principal=who)


def test_trust_judges_the_authenticated_sender_and_remembers_a_bounded_number_of_verdicts() -> None:
    role = m.Role.COORDINATOR
    trust = Trust(role, {t: senders_of(t, role) for t in receivable(role)})
    assert trust.forbidden(inbound(m.Heartbeat(sender="worker-1"), "worker-1")) == ""
    impostor = inbound(m.Heartbeat(sender="worker-2"), "worker-1")
    assert "not a name the key 'worker-1' may use" in trust.forbidden(impostor)
    promoted = inbound(m.Register(role=m.Role.TRAINER, sender="worker-1"), "worker-1")
    assert "may register only as a worker" in trust.forbidden(promoted)
    stranger = inbound(m.Heartbeat(sender="env-1"), "env-1")
    assert "accepted only from" in trust.forbidden(stranger)
    for i in range(VERDICTS_KEPT + 5):
        trust.forbidden(inbound(m.Heartbeat(sender=f"worker-{i}"), f"worker-{i}"))
    assert len(trust.verdicts) <= VERDICTS_KEPT


def test_requests_time_out_once_and_a_reply_clears_one() -> None:
    calls: list[float] = []
    r = Requests()
    r.expect("a", 1.0, "welcome", calls.append)
    r.expect("b", 2.0, "chunk", None)
    r.answered("b")
    assert not r.any_due(0.5) and r.overdue(0.5) == []
    due = r.overdue(1.0)
    assert [(mid, p.what) for mid, p in due] == [("a", "welcome")]
    assert r.overdue(5.0) == [] and r.pending == {}  # reported once


def test_the_membership_client_registers_hears_and_notices_silence() -> None:
    c = MembershipClient("coordinator")
    c.registering("reg-1")
    assert c.refused("reg-1") and not c.refused("other") and not c.refused("")
    assert c.silent_for(100.0, 5.0) is None  # not registered: nothing to lose yet
    c.welcomed(10.0)
    c.heard_from(12.0)
    assert c.silent_for(16.0, 5.0) is None and c.silent_for(17.5, 5.0) == 5.5
    assert c.forgotten() and not c.registered and not c.forgotten()  # re-register once


def test_the_lifecycle_a_stop_keeps_a_failure() -> None:
    life = Lifecycle()
    life.stop()
    assert life.stopped and life.failure is None
    life.fail("lost the coordinator")
    life.stop()
    assert life.stopped and life.failure == "lost the coordinator"


def test_each_actor_composes_the_parts_the_coordinator_without_a_membership_client() -> None:
    from prl_actors.classic.learner import LearnerCore
    from prl_actors.coordinator.core import CoordinatorCore

    assert WorkerCore.joins and not CoordinatorCore.joins and not LearnerCore.joins
    assert "tick" in vars(Core) and "Role.COORDINATOR" not in Core.tick.__code__.co_names


# --- handler tables ------------------------------------------------------------------------------


def test_a_core_without_a_handler_for_a_receivable_message_fails_when_built() -> None:
    class HalfBuffer(Core):
        role = m.Role.BUFFER

        @handles(m.Credit)
        def on_credit(self, now: float, inbound: Inbound[m.Credit]) -> None: ...

    with pytest.raises(
        TypeError, match="no handler for: epoch_close, epoch_open, group_dropped, group_refused, group_result"
    ):
        HalfBuffer("buffer", EventLog("buffer", "buffer"))


def test_a_message_the_role_cannot_receive_is_unexpected_even_with_a_handler() -> None:
    core = PublisherCore("publisher", EventLog("publisher", "publisher"), 1024, 5.0)
    shutdown_handler = core.handlers[m.Shutdown]  # inherited from Core: publishers do get shutdown
    assert shutdown_handler == "on_shutdown"
    assert m.Welcome in core.handlers and m.EpochStart not in receivable(m.Role.PUBLISHER)
    core.handle(0.0, Inbound(m.EpochStart(groups=1, sender="x"), [], identity=b"x"))
    (_, err, _), *_ = core.outbox
    assert isinstance(err, m.Error) and err.code == m.ErrorCode.UNEXPECTED


def test_routes_name_real_senders() -> None:
    assert senders_of(m.EpochOpen, m.Role.BUFFER) == {m.Role.COORDINATOR}
    assert senders_of(m.EpochOpen, m.Role.TRAINER) == {m.Role.BUFFER}
    assert senders_of(m.Credit, m.Role.BUFFER) == {m.Role.TRAINER}
    assert senders_of(m.Scale, m.Role.COORDINATOR) == {m.Role.OPERATOR}
    assert all(h.senders and h.receivers for h in HOPS)
