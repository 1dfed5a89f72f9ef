"""No request left without a reply or a logged timeout (DESIGN.md "No silent hang").

A request is a `send` of one of REQUESTS (an `epoch_open` only from the coordinator, a `weights_begin`
only from the trainer: the others are stream markers and replies) or, for senders that keep no log
(the CLI's status/scale/stop), the `recv` of one. A request R sent by A to P at time t is settled when:
1. A logged a `recv` whose reply_to is R's id, or a `request_timeout` with R's id; else
2. the end of the run explains it: P logged a reply at t_r and A or P stopped taking messages
   before t_r + GRACE_S (P killed outright right after logging it: the reply never left); or P
   logged receiving R at t_p, never replied, and P stopped before t_p + GRACE_S; or P never logged
   R and A or P stopped before t + GRACE_S (sent to, or by, an actor shutting down);
3. else P logged, in a `refusals` summary (runtime/refusals.py: refusals past the first ones are not
   logged one by one), a refusal of this type from this sender (or from sender "*": names folded)
   that no other request has taken.
Anything else is a violation, named by which of the three cases it is. "Stopped" is `ending_time`:
an actor's first ending event (shutdown, stop_requested, actor_crashed, actor_stopped, run_done) or
the coordinator's sending it Shutdown, whichever is first (else its incarnation's last event: one
killed outright logs no end). GRACE_S covers only
delivery skew: an actor handles its inbox in order and every reply is sent at once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from prl_actors.replay.events import Event, Run, Violation, at, ending_time

REQUESTS = frozenset(
    {
        "register",
        "work_request",
        "fetch_weights",
        "epoch_open",
        "weights_begin",
        "group_result",
        "weights_available",
        "step_done",
        "leave",
        "status_request",
        "scale",
        "request_stop",
    }
)
ONLY_FROM = {"epoch_open": "coordinator", "weights_begin": "trainer"}
GRACE_S = 0.5  # delivery skew between peers; an actor handles its inbox in order, replies are immediate


@dataclass
class ReplyReport:
    requests: int
    answered: int
    timed_out: int
    cut_off: int  # unanswered, explained by the end of the run
    violations: list[Violation]
    refused: int = 0  # unanswered one by one, accounted for by a `refusals` summary
    refusers: Counter[str] = field(default_factory=Counter)  # key -> refusals summarised (who flooded)


def is_request(run: Run, e: Event, actor_role: str) -> bool:
    want = ONLY_FROM.get(str(e.get("type")))
    return e.get("type") in REQUESTS and (want is None or actor_role == want) and not e.get("reply_to")


def peer_of(e: Event) -> str:
    """`to` is "peer:<name>" (a DEALER peer) or "id:<routing id>" (= the actor's name)."""
    to = str(e.get("to", ""))
    return to.split(":", 1)[1] if ":" in to else to


class _Index:
    """Lookups by message id: replies received, timeouts, receipts and replies sent."""

    def __init__(self, run: Run) -> None:
        self.got_reply: set[tuple[str, str]] = set()
        self.timeouts: set[tuple[str, str]] = set()
        self.received: dict[tuple[str, str], Event] = {}  # (receiver, msg_id)
        self.replied: dict[tuple[str, str], Event] = {}  # (replier, reply_to)
        self.summarized: Counter[tuple[str, str, str]] = Counter()  # (refuser, sender, type) -> not yet taken
        self.refusers: Counter[str] = Counter()
        for e in run.events:
            kind, actor = e["event"], e["actor"]
            if kind == "refusals":
                self._summary(actor, e)
            elif kind == "recv":
                if e.get("reply_to"):
                    self.got_reply.add((actor, e["reply_to"]))
                self.received.setdefault((actor, str(e.get("msg_id"))), e)
            elif kind == "request_timeout":
                self.timeouts.add((actor, str(e.get("msg_id"))))
            elif kind == "send" and e.get("reply_to"):
                self.replied.setdefault((actor, e["reply_to"]), e)

    def _summary(self, actor: str, e: Event) -> None:
        rows = e.get("refused")
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict) and isinstance(row.get("count"), int):
                self.summarized[(actor, str(row.get("sender")), str(row.get("type")))] += row["count"]
                who = row.get("principal") or row.get("sender") or row.get("kind")  # a handshake: no key
                self.refusers[f"{who} to {actor}"] += row["count"]

    def take_summarized(self, refuser: str, sender: str, kind: str) -> bool:
        """One refusal of a `kind` request from `sender` that `refuser` logged only in a summary."""
        for key in ((refuser, sender, kind), (refuser, "*", kind)):
            if self.summarized[key] > 0:
                self.summarized[key] -= 1
                return True
        return False


def check_replies(run: Run) -> ReplyReport:
    idx = _Index(run)
    report = ReplyReport(0, 0, 0, 0, [], refusers=idx.refusers)
    logged = set(run.actors)
    for e in run.events:
        role = run.role(e["actor"])
        if e["event"] == "send" and is_request(run, e, role):
            _settle(run, idx, e, report)
        elif e["event"] == "recv" and e.get("sender") not in logged and is_request(run, e, run.role(e["sender"])):
            _settle_unlogged(run, idx, e, report)
    return report


def _settle(run: Run, idx: _Index, r: Event, report: ReplyReport) -> None:
    a, p, mid, t = r["actor"], peer_of(r), str(r.get("msg_id")), r["t"]
    report.requests += 1
    if (a, mid) in idx.got_reply:
        report.answered += 1
        return
    if (a, mid) in idx.timeouts:
        report.timed_out += 1
        return
    what = f"{r.get('type')} from {at(r)} to {p}"
    reply, receipt = idx.replied.get((p, mid)), idx.received.get((p, mid))
    end_a = ending_time(run, a, t)
    if reply is not None:  # the reply may not have gone out: A stopped, or P died right after logging it
        ok = min(end_a, ending_time(run, p, reply["t"])) < reply["t"] + GRACE_S
        why = f"{p} replied ({at(reply)}) but {a} never logged receiving it (still running at +{end_a:.3f}s)"
    elif receipt is not None:
        end_p = ending_time(run, p, receipt["t"])
        ok = end_p < receipt["t"] + GRACE_S
        why = f"{p} received it (+{receipt['t']:.3f}s) and never replied, nor did {a} log a timeout"
    else:
        ok = min(end_a, ending_time(run, p, t)) < t + GRACE_S
        why = f"{p} never logged receiving it, and neither a reply nor a timeout was logged"
    if ok:
        report.cut_off += 1
    elif idx.take_summarized(p, a, str(r.get("type"))):
        report.refused += 1
    else:
        report.violations.append(Violation("replies", f"{what}: {why}"))


def _settle_unlogged(run: Run, idx: _Index, r: Event, report: ReplyReport) -> None:
    """A request from a sender without a log (the CLI): the receiver must have replied."""
    p, mid = r["actor"], str(r.get("msg_id"))
    report.requests += 1
    if (p, mid) in idx.replied:
        report.answered += 1
    elif ending_time(run, p, r["t"]) < r["t"] + GRACE_S:
        report.cut_off += 1
    elif idx.take_summarized(p, str(r.get("sender")), str(r.get("type"))):
        report.refused += 1
    else:
        what = f"{r.get('type')} from {r.get('sender')} received by {at(r)}"
        report.violations.append(Violation("replies", f"{what}: never answered"))
