"""Learner (classic RL): the env actors' side of the learner process, as an actor core (docs/ENVS.md).

It owns the run's N env slots (envkit/slots.py) and the env actors' membership (register, heartbeat,
leave; silent for `heartbeat_timeout_s` or a request unanswered for `step_timeout_s` = lost), and it
serves the learner's main thread, which calls in through `Deferred` items (EnvClient, the PPO loop):
- remote mode: `call_reset` / `call_step` run one VectorEnv call across the env actors (envkit/calls.py);
- acting mode: `publish` stores a policy version and opens the round it acts in; `next_round` hands
  over each complete round (envkit/rounds.py); PolicyCheck is answered with the published policy's
  logits once the round after the asker's is open; FetchWeights gets the current snapshot.
Invariants: a slot is owned by at most one live env actor; a lost actor's slots are counted
(`slot_lost`), their in-progress episodes truncated (remote: `truncated=True` with info `env_lost`;
acting: the round's slots listed lost), and the slots reset on another actor: never silently lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from prl_actors.classic.envkit.arrays import ArrayError, leading, unpack
from prl_actors.classic.envkit.calls import Done, Request, VectorCall
from prl_actors.classic.envkit.slots import SlotTable
from prl_actors.classic.learner_acting import ActingRounds, LearnerSettings
from prl_actors.protocol.messages import (
    Ack,
    EnvObs,
    EnvReset,
    EnvStep,
    EnvStepResult,
    Error,
    Heartbeat,
    HeartbeatAck,
    Leave,
    Msg,
    Register,
    Role,
    Shutdown,
    Welcome,
)
from prl_actors.runtime.core import handles
from prl_actors.runtime.membership import Membership
from prl_actors.transport.port import Dest, Inbound

if TYPE_CHECKING:
    from prl_actors.records.logs import EventLog

SUMMARY_EVERY = 1000  # vector steps between `env_steps` accounting events


class LearnerCore(ActingRounds):
    role = Role.LEARNER
    joins = False  # the env actors' membership server: no membership client part

    def __init__(self, name: str, log: EventLog, settings: LearnerSettings) -> None:
        super().__init__(name, log)
        self.s = settings
        self.members = Membership()
        self.slots = SlotTable(settings.num_envs)
        self.call: VectorCall | None = None
        self.step_no = 0
        self.last_obs = np.zeros((settings.num_envs, *settings.obs_shape), dtype=settings.obs_dtype)
        self.in_episode = np.zeros(settings.num_envs, dtype=bool)
        self.fresh: set[int] = set()  # placed on a new owner: reset there at the next call
        self.pending_loss: set[int] = set()  # lost between calls mid-episode: truncated at the next step
        self.dirty: set[str] = set()  # owners whose owned set changed since we last told them
        self.first_call_at = -1.0
        # remote accounting (`env_steps` events): slot_steps = stepped + reset + truncated, always
        self.totals = {"steps": 0, "slot_steps": 0, "stepped": 0, "reset": 0, "truncated": 0, "lost": 0}
        self.stepped_by: dict[str, int] = {}  # slot-steps each env actor answered
        if settings.mode == "acting":
            self.slots.seed = [settings.seed + s for s in range(settings.num_envs)]

    # --- membership --------------------------------------------------------------------------

    def live(self) -> list[str]:
        return [m.name for m in self.members.of_role(Role.ENV)]

    @handles(Register)
    def on_register(self, now: float, inbound: Inbound[Register]) -> None:
        msg = inbound.msg
        if msg.role != Role.ENV:
            self.refuse(inbound, f"only env actors register with the learner, not {msg.role}")
            return
        old = self.members.get(msg.sender)
        if old is not None:
            self._lose(old.name, "re_registered")
        self.members.join(msg.sender, msg.role, inbound.identity, now)
        self.log("member_join", member=msg.sender, member_role=msg.role, pid=msg.pid, host=msg.host)
        welcome = Welcome(
            reply_to=msg.id,
            run_id=self.s.run_id,
            mode=self.s.mode,
            group_size=0,
            groups_per_epoch=self.s.num_envs,
            heartbeat_interval_s=self.s.heartbeat_interval_s,
            publisher_addr=self.s.address,
            buffer_addr="",
        )
        self.reply(inbound, welcome)
        self._progress(now)

    @handles(Heartbeat)
    def on_heartbeat(self, now: float, inbound: Inbound[Heartbeat]) -> None:
        member = self.members.get(inbound.msg.sender)
        if member is not None:
            member.last_seen = now
        self.reply(inbound, HeartbeatAck(reply_to=inbound.msg.id, known=member is not None))

    @handles(Leave)
    def on_leave(self, now: float, inbound: Inbound[Leave]) -> None:
        if inbound.msg.sender in self.members:
            self._lose(inbound.msg.sender, f"leave:{inbound.msg.reason}" if inbound.msg.reason else "leave")
        self.reply(inbound, Ack(reply_to=inbound.msg.id))
        self._progress(now)

    def tick(self, now: float) -> None:
        super().tick(now)
        for m in self.members.silent(now, self.s.heartbeat_timeout_s):
            self._lose(m.name, "heartbeat_timeout")
        self._progress(now)

    def lose_member(self, actor: str, reason: str) -> None:
        self._lose(actor, reason)

    def _lose(self, actor: str, reason: str) -> None:
        """`actor` is gone: count its slots lost, truncate their episodes, place them elsewhere."""
        self.members.remove(actor)
        self.dirty.discard(actor)
        slots = self.slots.drop(actor)
        self.log("member_leave", member=actor, member_role=Role.ENV, reason=reason, slots=slots)
        if self.s.mode == "acting":
            for s in slots:
                self._count_lost(s, reason, "episode truncated; reset on another actor next round")
            self.acting_lost(actor, slots)
            return
        call = self.call
        cut = set()
        if call is not None:
            for mid, req in call.of_actor(actor):
                del call.requests[mid]
                if call.kind == "step" and req.kind == "step":
                    mid_episode = [s for s in req.slots if self.in_episode[s]]
                    call.truncate(mid_episode, self.last_obs)
                    cut.update(mid_episode)
        for s in slots:
            if s in cut:
                self._count_lost(s, reason, "truncated now")
            elif self.in_episode[s] and (call is None or call.filled[s]):
                self.pending_loss.add(s)
                self._count_lost(s, reason, "truncated at the next step")
            self.in_episode[s] = self.in_episode[s] and s not in cut
        self._place()

    def _count_lost(self, slot: int, reason: str, how: str) -> None:
        self.totals["lost"] += 1
        self.count("slots_lost")
        self.log("slot_lost", slot=slot, reason=reason, how=how, step=self.step_no)

    def _place(self) -> None:
        """Orphan slots go to the least-loaded live actors, where they are reset (fresh)."""
        for actor, placed in self.slots.place(self.live()).items():
            self.fresh.update(placed)
            self.dirty.add(actor)
            self.log("slot_placed", slots=placed, owner=actor, step=self.step_no)

    def _progress(self, now: float) -> None:
        if self.s.mode == "acting":
            self.acting_progress(now)
        elif self.call is not None:
            self._dispatch(now)

    # --- remote mode: one VectorEnv call at a time ---------------------------------------------

    def call_reset(self, now: float, seeds: list[int], done: Done) -> None:
        obs = np.zeros_like(self.last_obs)
        self.call = VectorCall("reset", self.step_no, obs, None, done, now)
        self.slots.seed = list(seeds)
        self.first_call_at = now if self.first_call_at < 0 else self.first_call_at
        self._dispatch(now)

    def call_step(self, now: float, actions: npt.NDArray[Any], done: Done) -> None:
        self.step_no += 1
        call = self.call = VectorCall("step", self.step_no, np.zeros_like(self.last_obs), actions, done, now)
        lost = sorted(self.pending_loss)
        call.truncate(lost, self.last_obs)
        self.pending_loss.clear()
        self.in_episode[lost] = False
        self._place()
        for s in range(self.s.num_envs):  # join at runtime: a finished episode may restart elsewhere
            if not self.in_episode[s] and s not in self.fresh and s not in lost:
                self._rebalance(s)
        self._dispatch(now)

    def _rebalance(self, slot: int) -> None:
        old = self.slots.owner[slot]
        new = self.slots.rebalance(slot, self.live())
        if new is not None and old is not None:
            self.fresh.add(slot)
            self.dirty.update({old, new})
            self.log("slot_moved", slot=slot, owner=new, previous=old, step=self.step_no)

    def _dispatch(self, now: float) -> None:
        call = self.call
        assert call is not None
        if call.kind == "reset" and not call.requests and not call.filled.any():
            if not self._enough_actors(now):
                return
            self.dirty.update(self.slots.assign_all(self.live(), self.slots.seed))
            self.fresh = set(range(self.s.num_envs))
        self._place()
        todo = call.open_slots()
        for actor, owned in self.slots.by_owner().items():
            mine = [s for s in todo if s in owned]
            resets = [s for s in mine if s in self.fresh or call.kind == "reset"]
            steps = [s for s in mine if s not in resets]
            if resets or actor in self.dirty:
                self._send_reset(now, actor, owned, resets)
            if steps:
                self._send_step(now, actor, steps)
        for actor in self.dirty & set(self.live()) - set(self.slots.by_owner()):
            self._send_reset(now, actor, [], [])  # it owns nothing now: drop its envs
        self._maybe_finish()

    def _enough_actors(self, now: float) -> bool:
        n = len(self.live())
        return n >= self.s.wait_actors or (n > 0 and now - self.first_call_at >= self.s.wait_actors_s)

    def _send_reset(self, now: float, actor: str, owned: list[int], slots: list[int]) -> None:
        seeds = [self.slots.reset_seed(s) for s in slots]
        msg = EnvReset(env_id=self.s.env_id, owned=owned, slots=slots, seeds=seeds)
        self._request(now, actor, msg, Request(actor, slots, "reset"))
        self.dirty.discard(actor)
        self.fresh.difference_update(slots)

    def _send_step(self, now: float, actor: str, slots: list[int]) -> None:
        from prl_actors.classic.envkit.arrays import pack

        call = self.call
        assert call is not None and call.actions is not None
        metas, frames = pack({"actions": call.actions[slots]})
        msg = EnvStep(step=call.step, slots=slots, arrays=metas)
        self._request(now, actor, msg, Request(actor, slots, "step"), frames)

    def _request(self, now: float, actor: str, msg: Msg, req: Request, frames: list[Any] | None = None) -> None:
        member = self.members.get(actor)
        assert member is not None and self.call is not None
        self.emit(Dest.reply(member.identity), msg, frames or [])
        self.call.requests[msg.id] = req
        self.expect(msg, self.s.step_timeout_s, f"{actor} reply", self._timeout(actor))

    def _timeout(self, actor: str) -> Callable[[float], None]:
        def lose(now: float) -> None:
            if actor in self.members:
                self._lose(actor, "step_timeout")
                self._progress(now)

        return lose

    @handles(EnvObs)
    def on_env_obs(self, now: float, inbound: Inbound[EnvObs]) -> None:
        req = self._answered(inbound.msg.reply_to)
        if req is None:
            return
        if not req.slots:  # an ownership change only
            self._maybe_finish()
            return
        try:
            obs = unpack(inbound.msg.arrays, inbound.payloads, required=["obs"])
            leading(obs, ["obs"], len(req.slots))
            self._check_obs(obs["obs"], req.slots)
        except ArrayError as exc:
            self._bad_reply(now, inbound, inbound.msg.reply_to, req, str(exc))
            return
        assert self.call is not None
        self.call.fill_reset(req.slots, obs["obs"])
        self.in_episode[req.slots] = True
        self._maybe_finish()

    @handles(EnvStepResult)
    def on_env_step_result(self, now: float, inbound: Inbound[EnvStepResult]) -> None:
        req = self._answered(inbound.msg.reply_to)
        if req is None:
            return
        names = ["obs", "reward", "terminated", "truncated"]
        try:
            arrays = unpack(inbound.msg.arrays, inbound.payloads, required=names)
            leading(arrays, names, len(req.slots))
            self._check_obs(arrays["obs"], req.slots)
        except ArrayError as exc:
            self._bad_reply(now, inbound, inbound.msg.reply_to, req, str(exc))
            return
        assert self.call is not None
        self.call.fill_step(req.slots, arrays)
        self.in_episode[req.slots] = ~(arrays["terminated"] | arrays["truncated"])
        self.stepped_by[req.actor] = self.stepped_by.get(req.actor, 0) + len(req.slots)
        self._maybe_finish()

    def _answered(self, reply_to: str) -> Request | None:
        call = self.call
        if call is None or reply_to not in call.requests:
            self.count("stale_reply")  # a reply to a request of a lost actor, or of a past call
            return None
        return call.requests.pop(reply_to)

    def _check_obs(self, obs: npt.NDArray[Any], slots: list[int]) -> None:
        want = (len(slots), *self.s.obs_shape)
        if tuple(obs.shape) != want or obs.dtype != np.dtype(self.s.obs_dtype):
            raise ArrayError(
                f"obs {obs.dtype}{list(obs.shape)} does not match the space {self.s.obs_dtype}{list(want)}"
            )

    def _bad_reply(self, now: float, inbound: Inbound[Msg], reply_to: str, req: Request, why: str) -> None:
        assert self.call is not None
        self.call.requests[reply_to] = req  # so _lose sees it as outstanding
        self.refuse(inbound, why)
        self._lose(req.actor, f"bad_reply: {why}")
        self._dispatch(now)

    def on_error(self, now: float, inbound: Inbound[Error]) -> None:
        super().on_error(now, inbound)
        call = self.call
        if call is not None and inbound.msg.reply_to in call.requests:
            actor = call.requests[inbound.msg.reply_to].actor
            self._lose(actor, f"refused: {inbound.msg.detail}")
            self._progress(now)

    def _maybe_finish(self) -> None:
        call = self.call
        if call is None or not call.complete:
            return
        self.call = None
        self.last_obs[:] = call.obs
        if call.kind == "step":
            self._account(call)
        call.done(call.result())

    def _account(self, call: VectorCall) -> None:
        """Every slot of every step: stepped by its env actor, reset (NEXT_STEP autoreset on a new
        owner), or truncated because its actor was lost. Logged every SUMMARY_EVERY steps."""
        t = self.totals
        t["steps"] += 1
        t["slot_steps"] += self.s.num_envs
        t["truncated"] += int(call.lost.sum())
        t["reset"] += int((call.by_reset & ~call.lost).sum())
        t["stepped"] += int((~call.by_reset & ~call.lost).sum())
        if self.step_no % SUMMARY_EVERY == 0:
            self.log_totals()

    def log_totals(self) -> None:
        by = dict(sorted(self.stepped_by.items()))
        self.log("env_steps", **self.totals, pending=len(self.pending_loss), stepped_by=by)

    # --- ending ------------------------------------------------------------------------------

    def finish(self, reason: str) -> None:
        """The run is over: Shutdown to every env actor, then stop."""
        if self.s.mode == "remote":
            self.log_totals()
        self.log("run_done", reason=reason)
        for m in self.members.of_role(Role.ENV):
            self.emit(Dest.reply(m.identity), Shutdown(reason=reason))
        self.stopped = True
