"""EnvActor: runs Gymnasium environments for the learner, in one of two modes (docs/ENVS.md).

remote  the learner's EnvClient drives it: EnvReset (own these slots, reset some) -> EnvObs;
        EnvStep (actions for its slots) -> EnvStepResult. Per slot exactly SyncVectorEnv's NEXT_STEP
        autoreset (envkit/local.py). torch is never imported.
acting  DETACH: EnvAct gives it slots; it steps them with its own copy of the policy and streams one
        Segment per round, tagged with the round (`epoch`) and the policy `version` it acted with. Then
        it sends a PolicyCheck with its recent observations; the learner answers after the round's
        update with its logits on them, and the actor fetches the new weights only when its KL
        estimate exceeds `sync_kl_threshold` (AAPS, pull-based; 0 = fetch every new version).
Invariants: it acts round r only after the learner cleared it (EnvAct or PolicyLogits of round r);
a segment carries only steps taken with one version; a slot it no longer owns is closed; when the
learner no longer knows it (heartbeat_ack known=false) it drops every env before registering again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prl_actors.classic.envkit.arrays import ArrayError, leading, pack, unpack
from prl_actors.protocol.messages import (
    EnvAct,
    EnvObs,
    EnvReset,
    EnvStep,
    EnvStepResult,
    Error,
    FetchWeights,
    HeartbeatAck,
    Leave,
    Msg,
    PolicyCheck,
    PolicyLogits,
    Role,
    Segment,
    Welcome,
)
from prl_actors.runtime.core import handles
from prl_actors.transport.port import Dest, Inbound
from prl_actors.weights.fetch import FetchingCore, WeightFetch
from prl_actors.weights.tensors import unpack as unpack_weights

if TYPE_CHECKING:
    from prl_actors.classic.envkit.local import SlotEnvs
    from prl_actors.records.logs import EventLog
    from prl_actors.weights.transfer import Snapshot

LEARNER = Dest.peer("learner")


@dataclass
class EnvActorSettings:
    seed: int = 0
    sync_kl_threshold: float = 0.0
    kl_obs_per_env: int = 32
    fetch_timeout_s: float = 30.0
    learner_timeout_s: float = 60.0  # nothing heard from the learner this long: it is gone, exit


class EnvCore(FetchingCore):
    role = Role.ENV
    membership_peer = "learner"

    def __init__(self, name: str, log: EventLog, envs: SlotEnvs, settings: EnvActorSettings) -> None:
        super().__init__(name, log)
        self.envs, self.s = envs, settings
        self.policy: Any = None  # envkit.acting.ActingPolicy, built on the first EnvAct (imports torch)
        self.steps = 0  # segment length
        self.act_round: int | None = None  # the round the learner cleared us to act next
        self.want_version = -1  # fetch this version before acting
        self.check_pending = False
        self.fetch = WeightFetch(settings.fetch_timeout_s)  # weights/fetch.py
        self.last_kl, self.synced = -1.0, False
        self.last_heard = -1.0  # when the learner last said anything (its heartbeat acks included)

    def start(self, now: float) -> None:
        self.last_heard = now
        self.register()

    def handle(self, now: float, inbound: Inbound[Msg]) -> None:
        self.last_heard = now
        super().handle(now, inbound)

    def request_stop(self, reason: str) -> None:
        """Graceful leave: the learner moves our slots (their episodes are counted truncated)."""
        self.log("stop_requested", reason=reason)
        self.emit(LEARNER, Leave(reason=reason))
        self.stopped = True

    def on_welcome(self, now: float, inbound: Inbound[Welcome]) -> None:
        super().on_welcome(now, inbound)
        self.log("env_mode", mode=inbound.msg.mode)

    def on_heartbeat_ack(self, now: float, inbound: Inbound[HeartbeatAck]) -> None:
        if not inbound.msg.known and self.registered:  # our slots were given away: start clean
            self.envs.own("", [])
            self.act_round, self.check_pending = None, False
        super().on_heartbeat_ack(now, inbound)

    # --- remote mode -----------------------------------------------------------------------------

    @handles(EnvReset)
    def on_env_reset(self, now: float, inbound: Inbound[EnvReset]) -> None:
        msg = inbound.msg
        if len(msg.seeds) != len(msg.slots) or not set(msg.slots) <= set(msg.owned):
            self.refuse(inbound, "env_reset: one seed per slot, and every reset slot must be owned")
            return
        try:
            self.envs.own(msg.env_id, msg.owned)
            obs = self.envs.reset(msg.slots, msg.seeds)
        except Exception as exc:  # an unknown env id, a failing env: the learner moves the slots
            self.refuse(inbound, f"env_reset failed: {type(exc).__name__}: {exc}")
            return
        self.log("env_reset", slots=msg.slots, owned=msg.owned, seeds=msg.seeds)
        metas, frames = pack({"obs": obs})
        self.reply(inbound, EnvObs(reply_to=msg.id, slots=msg.slots, arrays=metas), frames)

    @handles(EnvStep)
    def on_env_step(self, now: float, inbound: Inbound[EnvStep]) -> None:
        msg = inbound.msg
        try:
            actions = unpack(msg.arrays, inbound.payloads, required=["actions"])
            leading(actions, ["actions"], len(msg.slots))
            obs, reward, term, trunc, _valid = self.envs.step(msg.slots, actions["actions"])
        except (ArrayError, KeyError) as exc:
            self.refuse(inbound, f"env_step: {exc}")
            return
        except Exception as exc:  # a failing env: the learner counts the slots lost and moves them
            self.refuse(inbound, f"env_step failed: {type(exc).__name__}: {exc}")
            return
        self.count("env_steps_served")
        self.count("slot_steps_served", len(msg.slots))
        metas, frames = pack({"obs": obs, "reward": reward, "terminated": term, "truncated": trunc})
        result = EnvStepResult(reply_to=msg.id, step=msg.step, slots=msg.slots, arrays=metas)
        self.reply(inbound, result, frames)

    # --- acting mode -----------------------------------------------------------------------------

    @handles(EnvAct)
    def on_env_act(self, now: float, inbound: Inbound[EnvAct]) -> None:
        msg = inbound.msg
        if len(msg.seeds) != len(msg.slots) or not set(msg.slots) <= set(msg.owned) or msg.steps < 1:
            self.refuse(inbound, "env_act: one seed per new slot, new slots owned, steps >= 1")
            return
        try:
            self.envs.own(msg.env_id, msg.owned)
            self.envs.reset(msg.slots, msg.seeds)
        except Exception as exc:
            self.refuse(inbound, f"env_act failed: {type(exc).__name__}: {exc}")
            return
        self.log("env_act", round=msg.epoch, owned=msg.owned, new_slots=msg.slots, seeds=msg.seeds)
        if self.policy is None:
            from prl_actors.classic.envkit.acting import ActingPolicy

            self.policy = ActingPolicy(self.s.seed, self.name, self.s.kl_obs_per_env)
        self.steps = msg.steps
        if not self.check_pending:  # a fresh assignment acts with the round's own version
            self.act_round, self.want_version = msg.epoch, msg.version
        self._next()

    @handles(PolicyLogits)
    def on_policy_logits(self, now: float, inbound: Inbound[PolicyLogits]) -> None:
        from prl_actors.classic.envkit.acting import should_fetch

        msg = inbound.msg
        try:
            logits = unpack(msg.arrays, inbound.payloads, required=["logits"])["logits"]
            kl = self.policy.divergence(logits)
        except (ArrayError, ValueError, RuntimeError) as exc:
            self.refuse(inbound, f"policy_logits: {exc}")
            return
        held = self.policy.version
        fetch = should_fetch(self.s.sync_kl_threshold, kl, held, msg.version)
        self.log("aaps_check", round=msg.epoch, held=held, offered=msg.version, kl=kl, fetch=fetch)
        self.check_pending, self.last_kl = False, kl
        self.act_round = msg.epoch
        self.want_version = msg.version if fetch else held
        self._next()

    def _next(self) -> None:
        """Fetch if the wanted version is not held, else act the cleared round (as a later inbox item)."""
        if self.policy is None or self.fetch.busy or self.act_round is None:
            return
        if self.policy.version != self.want_version:
            self._fetch()
            return
        round_ = self.act_round
        self.act_round = None
        self.defer(lambda now: self._act(round_))

    def _act(self, round_: int) -> None:
        slots = self.envs.slots
        if not slots:
            return
        t0 = time.monotonic()
        data = self.policy.act(self.envs, slots, self.steps)
        metas, frames = pack(data.arrays)
        seg = Segment(
            epoch=round_,
            version=self.policy.version,
            slots=slots,
            steps=self.steps,
            episode_returns=data.returns,
            episode_lengths=data.lengths,
            sync_kl=self.last_kl,
            synced=self.synced,
            arrays=metas,
        )
        self.emit(LEARNER, seg, frames)
        self.log("segment_sent", round=round_, slots=slots, steps=self.steps, seconds=round(time.monotonic() - t0, 6))
        self.synced = False
        obs_metas, obs_frames = pack({"obs": self.policy.check_obs()})
        self.emit(LEARNER, PolicyCheck(epoch=round_, version=self.policy.version, arrays=obs_metas), obs_frames)
        self.check_pending = True

    # --- weights ---------------------------------------------------------------------------------

    def _fetch(self) -> None:
        self.log("span_begin", span="weight_sync", target=self.want_version)
        self.fetch.request(self.now)
        self.emit(LEARNER, FetchWeights(version=self.policy.version))

    def weights_arrived(self, now: float, snap: Snapshot, started: float) -> None:
        try:
            self.policy.load(snap.version, unpack_weights(snap.metas, snap.data, as_torch=True))
        except (KeyError, RuntimeError, ValueError) as exc:
            self.fetch_failed(self.fetch.fail(now, str(exc)))
            return
        self.fetch.clear()
        self.version, self.synced = snap.version, True
        self.want_version = max(self.want_version, snap.version)  # a newer one than asked for is fine too
        self.count("weight_fetches")
        self.log("span_end", span="weight_sync", new_version=snap.version, bytes=snap.nbytes)
        self._next()

    def on_error(self, now: float, inbound: Inbound[Error]) -> None:
        super().on_error(now, inbound)
        self.fetch.refused(now)  # e.g. nothing published yet: ask again soon

    def tick(self, now: float) -> None:
        super().tick(now)
        if now - self.last_heard > self.s.learner_timeout_s:  # a dead learner never keeps us alive
            self.log("learner_lost", silent_s=round(now - self.last_heard, 3))
            self.envs.close()
            self.stopped = True
            return
        self.fetch_failed(self.fetch.expired(now))
        if self.fetch.due(now):
            self._next()

    def close(self) -> None:
        self.envs.close()
