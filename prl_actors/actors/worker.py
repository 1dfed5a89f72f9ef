"""InferenceWorker: holds one weight version, pulls work for it, generates and scores whole groups.

Loop: Register -> (Welcome/EpochStart/HeartbeatAck say epoch e is open with v_e) -> FetchWeights
until the engine holds v_e -> WorkRequest(version=v_e) -> WorkAssign -> generate G samples per prompt
with v_e only, score them -> GroupResult(epoch e, version v_e) to the buffer -> WorkRequest ...
Every group is tagged with the version the engine held while generating it (on-policy by
construction); a worker that is behind never gets work, it is told `stale_version` and fetches.
"""

from __future__ import annotations

import time
from collections import deque

import msgspec

from prl_actors.actors.runtime import Core, handles
from prl_actors.actors.transfer import Assembler, TransferError
from prl_actors.engines.base import Engine, GeneratedGroup
from prl_actors.logs import EventLog
from prl_actors.protocol.messages import (
    EpochStart,
    Error,
    FetchWeights,
    Group,
    GroupAck,
    GroupResult,
    Heartbeat,
    HeartbeatAck,
    Leave,
    NoWork,
    NoWorkReason,
    Prompt,
    Role,
    Sample,
    WeightChunk,
    WeightsBegin,
    WeightsEnd,
    Welcome,
    WorkAssign,
    WorkRequest,
    new_id,
)
from prl_actors.protocol.versions import on_policy
from prl_actors.tasks.base import Task
from prl_actors.transport.port import Dest, Inbound
from prl_actors.weights import unpack

MAX_SEND_ATTEMPTS = 3


class WorkerCore(Core):
    role = Role.WORKER

    def __init__(
        self,
        name: str,
        log: EventLog,
        engine: Engine,
        task: Task,
        group_size: int,
        fetch_timeout_s: float,
        request_timeout_s: float,
        as_torch: bool = True,
        prefetch: int = 1,
    ) -> None:
        super().__init__(name, log)
        self.engine, self.task, self.group_size = engine, task, group_size
        self.fetch_timeout_s, self.request_timeout_s = fetch_timeout_s, request_timeout_s
        self.as_torch = as_torch
        self.target = -1  # the version of the open epoch, as last heard from the coordinator
        self.fetching: Assembler | None = None
        self.fetch_sent = 0.0
        self.requesting = False
        self.retry_at = 0.0
        self.busy: list[int] = []
        self.prefetch = prefetch
        self.assigned: deque[WorkAssign] = deque()  # assignments waiting for the engine
        self.generating = False

    def start(self, now: float) -> None:
        self.register()

    def heartbeat(self) -> Heartbeat | None:
        if not self.registered:
            return None
        return Heartbeat(
            epoch=self.epoch, version=self.engine.version, busy_groups=list(self.busy), refused=self.refused
        )

    def request_stop(self, reason: str) -> None:
        """Graceful leave: the coordinator requeues whatever we held."""
        self.log("stop_requested", reason=reason)
        self.emit(Dest.peer("coordinator"), Leave(reason=reason))
        self.stopped = True

    # --- what the coordinator says ---------------------------------------------------------------

    def on_welcome(self, now: float, inbound: Inbound[Welcome]) -> None:
        super().on_welcome(now, inbound)
        self._learn_target(inbound.msg.version)

    @handles(EpochStart)
    def on_epoch_start(self, now: float, inbound: Inbound[EpochStart]) -> None:
        self._learn_target(inbound.msg.version)

    def on_heartbeat_ack(self, now: float, inbound: Inbound[HeartbeatAck]) -> None:
        super().on_heartbeat_ack(now, inbound)
        if not inbound.msg.known:
            return
        if inbound.msg.version != self.target:
            self._learn_target(inbound.msg.version)

    def _learn_target(self, version: int) -> None:
        self.target = max(self.target, version)
        self._next()

    def _next(self) -> None:
        """Decide the next step: fetch weights, ask for work, or wait. With `prefetch` = 1 the next
        request goes out while a group is generating, so the round trip hides behind generation."""
        if not self.registered or self.target < 0 or self.fetching is not None or self.requesting:
            return
        if self.engine.version < self.target:
            if not self.generating:  # the engine is swapped between groups, never during one
                self._fetch()
            return
        if len(self.assigned) + self.generating > self.prefetch:
            return
        req = self.emit(Dest.peer("coordinator"), WorkRequest(epoch=self.target, version=self.engine.version))
        self.requesting = True
        self.expect(req, self.request_timeout_s, "work request", self._request_timed_out)

    def _request_timed_out(self, now: float) -> None:
        self.requesting = False
        self._next()

    def tick(self, now: float) -> None:
        super().tick(now)
        if self.fetching is not None and self.fetching.expired(now, self.fetch_timeout_s):
            self.log("weight_sync_failed", reason=f"no complete transfer in {self.fetch_timeout_s}s")
            self.count("weight_sync_failed")
            self.fetching = None
        if self.retry_at and now >= self.retry_at:
            self.retry_at = 0.0
            self._next()
        elif self.fetching is None and self.fetch_sent and now - self.fetch_sent > self.fetch_timeout_s:
            self.fetch_sent = 0.0
            self._next()

    # --- weights ---------------------------------------------------------------------------------

    def _fetch(self) -> None:
        self.log("span_begin", span="weight_sync", target=self.target)
        self.fetch_sent = self.now
        self.emit(Dest.peer("publisher"), FetchWeights(version=self.engine.version))

    @handles(WeightsBegin)
    def on_weights_begin(self, now: float, inbound: Inbound[WeightsBegin]) -> None:
        try:
            self.fetching = Assembler(inbound.msg, now)
        except TransferError as exc:
            self.log("weight_sync_failed", reason=str(exc))

    @handles(WeightChunk)
    def on_weight_chunk(self, now: float, inbound: Inbound[WeightChunk]) -> None:
        if self.fetching is None:
            return
        try:
            self.fetching.chunk(inbound.msg, inbound.payloads)
        except TransferError as exc:
            self.log("weight_sync_failed", reason=str(exc))
            self.fetching = None

    @handles(WeightsEnd)
    def on_weights_end(self, now: float, inbound: Inbound[WeightsEnd]) -> None:
        fetching, self.fetching = self.fetching, None
        if fetching is None:
            return
        try:
            snap = fetching.end(inbound.msg)
        except TransferError as exc:
            self.log("weight_sync_failed", reason=str(exc))
            self.retry_at = now + 0.1
            return
        self.engine.load_weights(snap.version, unpack(snap.metas, snap.data, as_torch=self.as_torch))
        self.version = snap.version
        self.fetch_sent = 0.0
        self.log(
            "span_end",
            span="weight_sync",
            new_version=snap.version,
            bytes=snap.nbytes,
            seconds=round(time.monotonic() - fetching.started, 6),
        )
        self._next()

    def on_error(self, now: float, inbound: Inbound[Error]) -> None:
        super().on_error(now, inbound)
        self.requesting = False
        self.fetch_sent = 0.0
        self.retry_at = now + 0.2

    # --- work ------------------------------------------------------------------------------------

    @handles(NoWork)
    def on_no_work(self, now: float, inbound: Inbound[NoWork]) -> None:
        self.requesting = False
        reason = inbound.msg.reason
        if reason == NoWorkReason.DONE:
            return
        if reason == NoWorkReason.STALE_VERSION:
            self._learn_target(inbound.msg.version)
            return
        # queue_empty / no_epoch: the coordinator nudges us (EpochStart); poll slowly as a fallback
        self.retry_at = now + max(inbound.msg.retry_after_s, 1.0)

    @handles(WorkAssign)
    def on_work_assign(self, now: float, inbound: Inbound[WorkAssign]) -> None:
        self.requesting = False
        self.assigned.append(inbound.msg)
        if not self.generating:
            self._start_next()
        else:
            self._next()

    def _start_next(self) -> None:
        """Take the next assignment; ask for more now (flushed before the long call), generate later."""
        msg = self.assigned.popleft()
        self.generating = True
        self._next()
        self.defer(lambda now: self._work(msg))

    def _work(self, msg: WorkAssign) -> None:
        if msg.version == self.engine.version and on_policy(msg.epoch, msg.version):
            self._generate_and_send(msg)
        else:  # weights changed while it waited: its epoch is over, the group was done elsewhere
            self.log("assign_refused", reason="version mismatch", msg_version=msg.version)
        self.generating = False
        if self.assigned:
            self._start_next()
        else:
            self._next()

    def _generate_and_send(self, msg: WorkAssign) -> None:
        self.epoch = msg.epoch
        self.busy = [p.group_id for p in msg.prompts]
        try:
            generated, gen_s = self._generate(msg)
        except Exception as exc:  # engine failure: hand the groups back by registering anew
            self.count("generate_failed")
            self.log("generate_failed", error=f"{type(exc).__name__}: {exc}", groups=self.busy)
            self.busy, self.registered = [], False
            self.assigned.clear()
            self.register()
            return
        self.log("span_begin", span="score")
        prompts = {p.group_id: p for p in msg.prompts}
        for g in generated:
            group = self._score(g, prompts[g.group_id], gen_s / max(1, len(generated)))
            out = GroupResult(epoch=msg.epoch, version=msg.version, group=group, ticket=prompts[g.group_id].ticket)
            self._send_group(out, attempt=1)
        self.log("span_end", span="score")
        self.busy = []

    def _generate(self, msg: WorkAssign) -> tuple[list[GeneratedGroup], float]:
        self.log("span_begin", span="generate", groups=self.busy, msg_id=msg.id)
        t0 = time.monotonic()
        generated = self.engine.generate(msg.prompts, self.group_size)
        gen_s = time.monotonic() - t0
        self.log("span_end", span="generate", groups=self.busy, seconds=round(gen_s, 6))
        return generated, gen_s

    def _send_group(self, out: GroupResult, attempt: int) -> None:
        """Send a group; without a GroupAck in time, send it again (the buffer dedups: retry, never skip)."""
        self.emit(Dest.peer("buffer"), out)
        gid = out.group.group_id
        self.log(
            "group_sent", group_id=gid, msg_id=out.id, msg_epoch=out.epoch, msg_version=out.version, attempt=attempt
        )
        if attempt < MAX_SEND_ATTEMPTS:
            retry = msgspec.structs.replace(out, id=new_id())
            self.expect(
                out,
                self.request_timeout_s,
                f"buffer ack of group {gid}",
                lambda now: self._send_group(retry, attempt + 1),
            )

    def _score(self, g: GeneratedGroup, prompt: Prompt, gen_s: float) -> Group:
        samples = [
            Sample(
                text=s.text,
                token_ids=s.token_ids,
                logprobs=s.logprobs,
                reward=self.task.score(prompt, s.text),
                finished=s.finished,
            )
            for s in g.samples
        ]
        return Group(
            group_id=g.group_id,
            prompt=g.prompt,
            prompt_ids=g.prompt_ids,
            samples=samples,
            worker=self.name,
            gen_s=gen_s,
        )

    @handles(GroupAck)
    def on_group_ack(self, now: float, inbound: Inbound[GroupAck]) -> None:
        msg = inbound.msg
        self.count("groups_accepted" if msg.accepted else f"groups_rejected.{msg.reason}")

    def close(self) -> None:
        self.engine.close()
