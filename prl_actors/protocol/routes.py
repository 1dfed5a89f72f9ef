"""Who may send which message to whom: the protocol's routing table, one row per hop.

Uses of this one table:
- every actor core: each message its role can receive must have a handler (checked when the core is
  built), and a message its role cannot receive is answered `unexpected`, handler or not;
- docs/PROTOCOL.md: its hop table is generated from here (`python -m prl_actors.protocol.doc`) and a
  test checks the page against it;
- the sender's role is part of the table, so a receiver can refuse a message from a role that may not
  send it.
"""

from __future__ import annotations

from dataclasses import dataclass

from prl_actors.protocol.messages import (
    MESSAGE_TYPES,
    Ack,
    Credit,
    EnvAct,
    EnvObs,
    EnvReset,
    EnvStep,
    EnvStepResult,
    EpochClose,
    EpochComplete,
    EpochOpen,
    EpochStart,
    Error,
    EvalAssign,
    EvalResult,
    FetchWeights,
    GiveBack,
    GroupAccepted,
    GroupAck,
    GroupDropped,
    GroupRefused,
    GroupResult,
    Heartbeat,
    HeartbeatAck,
    Leave,
    Msg,
    NoWork,
    PolicyCheck,
    PolicyLogits,
    Register,
    RequestStop,
    Role,
    Scale,
    Segment,
    Shutdown,
    Status,
    StatusRequest,
    StepDone,
    TrainGroup,
    WeightChunk,
    WeightsAvailable,
    WeightsBegin,
    WeightsEnd,
    WeightsStored,
    Welcome,
    WorkAssign,
    WorkRequest,
)

C, P, B, T, W, OP = Role.COORDINATOR, Role.PUBLISHER, Role.BUFFER, Role.TRAINER, Role.WORKER, Role.OPERATOR
MEMBERS = frozenset({P, B, T, W})  # roles that register with the coordinator
ACTORS = frozenset({C, *MEMBERS})  # roles that run an actor core
E, L = Role.ENV, Role.LEARNER  # classic RL: env actors are members of the learner's run (docs/ENVS.md)
ANYONE = frozenset(Role)
CLIENTS = ANYONE - {C}  # who may ask for status (the CLI speaks for an operator or a member)


@dataclass(frozen=True)
class Hop:
    """`msg` may travel from any of `senders` to any of `receivers`."""

    msg: type[Msg]
    senders: frozenset[Role]
    receivers: frozenset[Role]
    note: str


def _roles(r: Role | frozenset[Role]) -> frozenset[Role]:
    return r if isinstance(r, frozenset) else frozenset({r})


def _hop(msg: type[Msg], senders: Role | frozenset[Role], receivers: Role | frozenset[Role], note: str) -> Hop:
    return Hop(msg, _roles(senders), _roles(receivers), note)


HOPS: tuple[Hop, ...] = (
    # membership
    _hop(Register, MEMBERS, C, "join the run; reply welcome"),
    _hop(Welcome, C, MEMBERS, "reply to register: the run's settings and the open epoch"),
    _hop(Heartbeat, MEMBERS, C, "liveness and the version held; reply heartbeat_ack"),
    _hop(HeartbeatAck, C, MEMBERS, "the open epoch; known=false: register again"),
    _hop(Leave, MEMBERS, C, "graceful exit, held groups are requeued; reply ack"),
    _hop(Shutdown, C, MEMBERS, "the run is over: exit cleanly"),
    # epochs and work
    _hop(EpochOpen, C, B, "accept groups 0..B-1 of the epoch; reply ack (the barrier before any work)"),
    _hop(EpochStart, C, frozenset({W, T}), "the epoch is open (also a nudge when work returns)"),
    _hop(WorkRequest, W, C, "give me up to max_groups groups; reply work_assign or no_work"),
    _hop(WorkAssign, C, W, "generate these groups with the epoch's weights"),
    _hop(NoWork, C, W, "nothing now, with a reason"),
    _hop(EvalAssign, C, W, "the epoch's queue is empty: generate k samples per eval prompt (never trained)"),
    _hop(EvalResult, W, C, "eval completions and rewards; unreturned eval prompts are requeued; reply ack"),
    _hop(GroupResult, W, B, "a finished, scored group; reply group_ack"),
    _hop(GroupAck, B, W, "accepted, or refused with a reason"),
    _hop(GroupAccepted, B, C, "the group is done and never handed out again"),
    _hop(GiveBack, W, C, "generating/scoring these held groups failed: requeue them now; reply ack"),
    _hop(GroupRefused, T, B, "the forward/backward failed on this group alone: not trained"),
    _hop(GroupRefused, B, C, "a group refused for its content (or by the trainer): requeue it"),
    _hop(GroupDropped, C, B, "a group given up (task.on_error skip): the epoch completes without it; reply ack"),
    _hop(EpochClose, C, B, "dynamic sampling: no more rounds, train the informative groups; reply ack"),
    # the buffer's stream to the trainer
    _hop(Credit, T, B, "the trainer can take n more groups"),
    _hop(EpochOpen, B, T, "the epoch's stream begins"),
    _hop(TrainGroup, B, T, "one accepted group (costs a credit)"),
    _hop(EpochComplete, B, T, "every group was sent: take the step"),
    _hop(StepDone, T, C, "the step's weights are stored; reply ack"),
    # weights
    _hop(WeightsBegin, T, P, "upload: a transfer begins"),
    _hop(WeightChunk, T, P, "upload: raw bytes in frame 1"),
    _hop(WeightsEnd, T, P, "upload: the transfer ends; reply weights_stored"),
    _hop(WeightsStored, P, T, "the upload is stored and served"),
    _hop(WeightsAvailable, P, C, "a version can be fetched; reply ack"),
    _hop(FetchWeights, W, P, "send me the current weights; reply a transfer"),
    _hop(WeightsBegin, P, W, "fetch reply: a transfer begins"),
    _hop(WeightChunk, P, W, "fetch reply: raw bytes in frame 1"),
    _hop(WeightsEnd, P, W, "fetch reply: the transfer ends"),
    # control
    _hop(StatusRequest, CLIENTS, C, "reply status"),
    _hop(Status, C, OP, "the run's state, members and progress (to the CLI client that asked)"),
    _hop(Scale, OP, C, "the wanted number of workers; reply ack"),
    _hop(RequestStop, OP, C, "stop the run; reply ack, then shutdown to every member"),
    # classic RL: the learner's env actors (membership, remote stepping, acting, weights)
    _hop(Register, E, L, "an env actor joins the learner's run; reply welcome"),
    _hop(Welcome, L, E, "reply to register: the run id, mode (remote/acting), heartbeat interval"),
    _hop(Heartbeat, E, L, "env actor liveness; reply heartbeat_ack"),
    _hop(HeartbeatAck, L, E, "known=false: register again (its slots were moved)"),
    _hop(Leave, E, L, "graceful exit: its slots move, their episodes counted truncated; reply ack"),
    _hop(Shutdown, L, E, "the classic-RL run is over: exit cleanly"),
    _hop(EnvReset, L, E, "own these slots, reset some of them; reply env_obs"),
    _hop(EnvObs, E, L, "the reset observations (typed array frame)"),
    _hop(EnvStep, L, E, "step these slots with these actions (typed array frame); reply env_step_result"),
    _hop(EnvStepResult, E, L, "obs, reward, terminated, truncated (typed array frames)"),
    _hop(EnvAct, L, E, "acting mode: act on these slots with your policy copy"),
    _hop(Segment, E, L, "acting mode: a trajectory segment tagged with round and policy version; reply ack"),
    _hop(PolicyCheck, E, L, "AAPS: my recent observations; reply policy_logits after the round's update"),
    _hop(PolicyLogits, L, E, "AAPS: the learner's logits on them (the env actor estimates KL, may fetch)"),
    _hop(FetchWeights, E, L, "send me the learner's policy weights; reply a transfer"),
    _hop(WeightsBegin, L, E, "policy fetch reply: a transfer begins"),
    _hop(WeightChunk, L, E, "policy fetch reply: raw bytes in frame 1"),
    _hop(WeightsEnd, L, E, "policy fetch reply: the transfer ends"),
    _hop(Ack, L, E, "reply to leave and segment"),
    # replies any request may get
    _hop(Ack, frozenset({C, B}), ANYONE, "generic positive reply"),
    _hop(Error, ANYONE, ANYONE, "a message that could not be decoded or handled"),
)


def receivable(role: Role) -> frozenset[type[Msg]]:
    """Every message type `role` may receive (and so must handle)."""
    return frozenset(h.msg for h in HOPS if role in h.receivers)


def senders_of(msg: type[Msg], receiver: Role) -> frozenset[Role]:
    """The roles that may send `msg` to `receiver`."""
    return frozenset(r for h in HOPS if h.msg is msg and receiver in h.receivers for r in h.senders)


def _check_complete() -> None:
    """Every message type of the protocol travels on at least one hop (import-time self-check)."""
    missing = set(MESSAGE_TYPES.values()) - {h.msg for h in HOPS}
    if missing:
        raise RuntimeError(f"messages without a hop in routes.HOPS: {sorted(t.__name__ for t in missing)}")


_check_complete()
