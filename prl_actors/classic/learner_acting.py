"""The learner core's acting-mode half (DETACH + AAPS): rounds, segments, policy checks, weight fetches.

Round r acts with the policy version published for it (`versions.epoch_for(version)`). Opening it
places orphan slots, evens out the actors' loads (a moved slot starts a new episode on its new owner;
the segment already trained bootstrapped from its last observation, so nothing is cut short), sends
EnvAct to every actor whose slots changed (before any PolicyLogits, so an actor learns its slots first),
then answers the PolicyChecks of the previous round with the new policy's logits. The round is handed to
the learner when every expected slot was received or lost (envkit/rounds.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from prl_actors.classic.envkit.arrays import ArrayError, pack, unpack
from prl_actors.classic.envkit.rounds import Received, RoundBatch, RoundBook
from prl_actors.protocol.messages import Ack, EnvAct, FetchWeights, PolicyCheck, PolicyLogits, Segment
from prl_actors.protocol.versions import epoch_for
from prl_actors.runtime.core import Core, handles
from prl_actors.transport.port import Dest, Inbound
from prl_actors.weights.transfer import Snapshot, transfer_messages

if TYPE_CHECKING:
    from prl_actors.classic.envkit.calls import Done
    from prl_actors.classic.envkit.slots import SlotTable
    from prl_actors.records.logs import EventLog
    from prl_actors.runtime.membership import Membership

Array = npt.NDArray[Any]
PolicyFn = Callable[[Array], Array]  # observations [K, *obs] -> logits [K, n_actions]
STEP_ARRAYS = ("actions", "logprobs", "rewards", "terminated", "truncated", "valid")


@dataclass
class LearnerSettings:
    run_id: str
    mode: str  # "remote" or "acting"
    env_id: str
    num_envs: int
    obs_shape: tuple[int, ...]
    obs_dtype: str
    address: str
    seed: int = 0
    heartbeat_interval_s: float = 0.2
    heartbeat_timeout_s: float = 2.0
    step_timeout_s: float = 10.0
    wait_actors: int = 1
    wait_actors_s: float = 10.0
    steps_per_segment: int = 128
    chunk_bytes: int = 4 << 20
    round_timeout_s: float = 120.0


@dataclass
class _Check:
    dest: Dest
    msg: PolicyCheck
    obs: Array


class ActingRounds(Core):
    s: LearnerSettings
    members: Membership
    slots: SlotTable
    first_call_at: float

    def __init__(self, name: str, log: EventLog) -> None:
        super().__init__(name, log)
        self.book = RoundBook()
        self.snapshot: Snapshot | None = None
        self.policy_fn: PolicyFn | None = None
        self.handed = -1  # the last round handed to the learner
        self.checks: list[_Check] = []
        self.told: dict[str, list[int]] = {}  # actor -> the slots of its last EnvAct
        self.ready: list[RoundBatch] = []
        self.waiter: Done | None = None
        self.fetches: dict[int, int] = {}  # version -> fetches served
        self.opened_at = 0.0

    def live(self) -> list[str]:
        raise NotImplementedError

    def lose_member(self, actor: str, reason: str) -> None:
        raise NotImplementedError

    # --- the main thread's side ------------------------------------------------------------------

    def publish(self, now: float, version: int, snapshot: Snapshot, policy_fn: PolicyFn) -> None:
        """Serve `version` from now on and open the round it acts in (when actors are there)."""
        self.snapshot, self.policy_fn = snapshot, policy_fn
        self.version = version
        self.log("policy_published", new_version=version, bytes=snapshot.nbytes)
        if self.first_call_at < 0:
            self.first_call_at = now
        self.acting_progress(now)

    def next_round(self, now: float, done: Done) -> None:
        """`done(batch)` with the next complete round (at once if one is ready)."""
        if self.ready:
            done(self.ready.pop(0))
        else:
            self.waiter = done

    # --- rounds ----------------------------------------------------------------------------------

    def acting_progress(self, now: float) -> None:
        if self.book.is_open and now - self.opened_at > self.s.round_timeout_s:
            for actor in [a for a in self.book.expected if a not in self.book.received]:
                self.lose_member(actor, "round_timeout")  # alive but not acting: its slots are lost
        if self.snapshot is None or self.book.is_open:
            return
        round_ = epoch_for(self.snapshot.version)
        live = self.live()
        enough = len(live) >= self.s.wait_actors or now - self.first_call_at >= self.s.wait_actors_s
        if round_ != self.handed + 1 or not live or not (round_ > 0 or enough):
            return
        self.opened_at = now
        self._open(round_, live)

    def _open(self, round_: int, live: list[str]) -> None:
        assert self.snapshot is not None and self.policy_fn is not None
        version = self.snapshot.version
        self._assign(live)
        expected = {a: self.slots.owned(a) for a in live}
        for actor, owned in expected.items():
            if owned != self.told.get(actor):
                self._send_act(round_, version, actor, owned)
        self.book.open(round_, version, expected)
        self.log("round_open", round=round_, round_version=version, expected=self.book.expected)
        self._answer_open_checks()

    def _assign(self, live: list[str]) -> None:
        """Orphans to the least loaded; then move slots until loads differ by at most one."""
        for actor, placed in self.slots.place(live).items():
            self.log("slot_placed", slots=placed, owner=actor, round=self.book.round + 1)
        while True:
            loads = {a: self.slots.owned(a) for a in live}
            busiest = max(live, key=lambda a: (len(loads[a]), a))
            if not loads[busiest] or self.slots.rebalance(loads[busiest][-1], live) is None:
                return
            self.log(
                "slot_moved", slot=loads[busiest][-1], previous=busiest, owner=self.slots.owner[loads[busiest][-1]]
            )

    def _send_act(self, round_: int, version: int, actor: str, owned: list[int]) -> None:
        member = self.members.get(actor)
        assert member is not None
        new = sorted(set(owned) - set(self.told.get(actor, [])))
        seeds = [self.slots.reset_seed(s) for s in new]
        act = EnvAct(
            epoch=round_,
            version=version,
            env_id=self.s.env_id,
            owned=owned,
            slots=new,
            seeds=seeds,
            steps=self.s.steps_per_segment,
        )
        self.emit(Dest.reply(member.identity), act)
        self.told[actor] = owned

    def acting_lost(self, actor: str, slots: list[int]) -> None:
        self.told.pop(actor, None)
        self.checks = [c for c in self.checks if c.msg.sender != actor]
        lost = self.book.lose(actor)
        if lost:
            self.count("segments_lost")
            self.log("segment_lost", round=self.book.round, member=actor, slots=lost)
        self._hand_if_complete()

    def _hand_if_complete(self) -> None:
        if not self.book.complete:
            return
        batch = self.book.take()
        if not batch.segments:  # every actor of the round was lost: open it again when actors are back
            self.log("round_empty", round=batch.round, lost_slots=batch.lost_slots)
            return
        self.handed = batch.round
        batch.stats = {"fetches": self.fetches.get(batch.version, 0)}
        self.log(
            "round_done",
            round=batch.round,
            round_version=batch.version,
            segments=[{"actor": s.actor, "slots": s.slots, "version": s.version} for s in batch.segments],
            lost_slots=batch.lost_slots,
            fetches=batch.stats["fetches"],
        )
        if self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            waiter(batch)
        else:
            self.ready.append(batch)

    # --- messages --------------------------------------------------------------------------------

    def _acting_only(self, inbound: Inbound[Any]) -> bool:
        if self.s.mode != "acting" or inbound.msg.sender not in self.members:
            self.refuse(inbound, "not an acting env actor of this run (register first; mode must be acting)")
            return False
        return True

    @handles(Segment)
    def on_segment(self, now: float, inbound: Inbound[Segment]) -> None:
        msg = inbound.msg
        if not self._acting_only(inbound):
            return
        why = self.book.refusal(msg.epoch, msg.sender, msg.slots)
        try:
            arrays = self._segment_arrays(msg, inbound.payloads) if why is None else {}
        except ArrayError as exc:
            why = str(exc)
        if why is not None:
            self.count("segments_refused")
            self.refuse(inbound, f"segment refused: {why}")
            return
        seg = Received(
            msg.sender, sorted(msg.slots), msg.version, arrays, msg.episode_returns, msg.episode_lengths,
            msg.sync_kl, msg.synced,
        )  # fmt: skip
        self.book.receive(seg)
        self.log(
            "segment_received", round=msg.epoch, member=msg.sender, slots=seg.slots, seg_version=msg.version,
            steps=msg.steps, sync_kl=msg.sync_kl, synced=msg.synced, episodes=len(msg.episode_returns),
        )  # fmt: skip
        self.reply(inbound, Ack(reply_to=msg.id))
        self._hand_if_complete()

    def _segment_arrays(self, msg: Segment, payloads: list[Any]) -> dict[str, Array]:
        if sorted(msg.slots) != list(msg.slots):
            raise ArrayError("segment slots must be sorted")
        arrays = unpack(msg.arrays, payloads, required=("obs", "next_obs", *STEP_ARRAYS))
        t, n = msg.steps, len(msg.slots)
        shapes = {"obs": (t, n, *self.s.obs_shape), "next_obs": (n, *self.s.obs_shape)}
        shapes.update({k: (t, n) for k in STEP_ARRAYS})
        for name, shape in shapes.items():
            if tuple(arrays[name].shape) != shape:
                raise ArrayError(f"array {name!r} has shape {list(arrays[name].shape)}, expected {list(shape)}")
        return arrays

    @handles(PolicyCheck)
    def on_policy_check(self, now: float, inbound: Inbound[PolicyCheck]) -> None:
        if not self._acting_only(inbound):
            return
        try:
            obs = unpack(inbound.msg.arrays, inbound.payloads, required=["obs"])["obs"]
            if tuple(obs.shape[1:]) != self.s.obs_shape:
                raise ArrayError(f"obs has shape {list(obs.shape)}, expected [K, {self.s.obs_shape}]")
        except ArrayError as exc:
            self.refuse(inbound, f"policy_check: {exc}")
            return
        self.checks.append(_Check(self.source(inbound), inbound.msg, np.array(obs)))
        self._answer_open_checks()

    def _answer_open_checks(self) -> None:
        """Checks of rounds before the open one can be answered now."""
        if self.book.is_open and self.snapshot is not None and self.policy_fn is not None:
            round_, version = self.book.round, self.snapshot.version
            for check in [c for c in self.checks if c.msg.epoch < round_]:
                self.checks.remove(check)
                metas, frames = pack({"logits": self.policy_fn(check.obs)})
                reply = PolicyLogits(reply_to=check.msg.id, epoch=round_, version=version, arrays=metas)
                self.emit(check.dest, reply, frames)

    @handles(FetchWeights)
    def on_fetch_weights(self, now: float, inbound: Inbound[FetchWeights]) -> None:
        if self.snapshot is None:
            self.refuse(inbound, "no policy published yet")
            return
        snap = self.snapshot
        for msg, frames in transfer_messages(snap, self.s.chunk_bytes, reply_to=inbound.msg.id):
            self.reply(inbound, msg, frames)
        self.fetches[snap.version] = self.fetches.get(snap.version, 0) + 1
        self.count("weight_fetches")
        self.log("weights_served", to=inbound.msg.sender, served_version=snap.version, held=inbound.msg.version)
