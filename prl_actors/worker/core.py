"""InferenceWorker: holds one weight version, pulls work for it, generates and scores whole groups.

Loop: Register -> (Welcome/EpochStart/HeartbeatAck say epoch e is open with v_e) -> FetchWeights
until the engine holds v_e -> WorkRequest(version=v_e, max_groups=what fits) -> WorkAssign -> the
groups join the engine's running batch (continuous batching) -> every `step` (one inbox item each, so
messages are handled in between) returns the groups just finished, which are scored and sent to the
buffer at once as GroupResult(epoch e, version v_e) -> more WorkRequests as rows free up ...
Every group is tagged with the version the engine held while generating it (on-policy by
construction): weights are swapped only when the engine is idle; a worker that learns of a newer
epoch drops what is still running (those groups belong to an epoch that is complete) and fetches.
A worker that is behind never gets work: it is told `stale_version` and fetches.
Bounded mode (run.mode bounded, k = run.max_staleness): the coordinator's target is the epoch's floor
v_{e-k}, so a worker keeps generating with the weights it holds while they are at most k versions
behind the open epoch, and fetches (the newest published) once they fall below the floor (a `floor`
pull); with `worker.sync_kl_threshold` it also pulls earlier, once the estimated divergence of its
weights from the newest published ones crosses the threshold (a `drift` pull: it stops asking for work,
lets its running groups finish with the weights they started with, then fetches; weights/pulls.py).
Every load is logged as `weights_pulled` (reason, versions skipped).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import msgspec

from prl_actors.engines.base import Engine, GeneratedGroup, engine_notes
from prl_actors.protocol.messages import (
    EpochStart,
    Error,
    EvalAssign,
    EvalGroup,
    EvalResult,
    GenerationContract,
    GiveBack,
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
    WeightsBegin,
    Welcome,
    WorkAssign,
    WorkRequest,
    new_id,
)
from prl_actors.protocol.versions import within_bound
from prl_actors.records.logs import EventLog, console
from prl_actors.rewards.errors import RewardError, RewardStopped
from prl_actors.runtime.contract import refusal
from prl_actors.runtime.core import LOUD_EVERY, LOUD_FIRST, handles
from prl_actors.transport.port import Dest, Inbound
from prl_actors.weights.fetch import FetchingCore, WeightFetch
from prl_actors.weights.shm import ShmReader
from prl_actors.weights.transfer import Snapshot
from prl_actors.worker.evaluating import Evaluation
from prl_actors.worker.weights import Weights

if TYPE_CHECKING:
    from prl_actors.runtime.threads import ThreadPlan
    from prl_actors.tasks.base import Task

MAX_SEND_ATTEMPTS = 3


class WorkerCore(FetchingCore):
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
        shm: ShmReader | None = None,
        threads: ThreadPlan | None = None,
        eval_sampling: Any = None,
        max_staleness: int = 0,
        sync_kl_threshold: float | None = None,
        contract: GenerationContract | None = None,
    ) -> None:
        super().__init__(name, log)
        self.contract = contract  # what it generates under (runtime/contract.py): sent in Register, checked on Welcome
        self.engine, self.task, self.group_size = engine, task, group_size
        self.request_timeout_s = request_timeout_s
        self.as_torch = as_torch
        self.target = -1  # the version of the open epoch, as last heard from the coordinator
        self.fetch = WeightFetch(fetch_timeout_s)  # weights/fetch.py
        self.requesting = False
        self.retry_at = 0.0  # poll for work again (after a NoWork or an Error)
        self.hold: NoWorkReason | None = None  # why not to ask now (cleared by a nudge, an ack, retry_at)
        self.prefetch = prefetch
        self.assigned: dict[int, tuple[WorkAssign, Prompt]] = {}  # group id -> its assignment, in the engine
        self.stepping = False  # a step of the engine is queued in the inbox
        self.busy_since = 0.0
        self.shm = shm  # same-host snapshots (weights/shm.py); None: chunks only
        self.run_id = ""
        self.threads = threads  # with one local worker: every core until the epoch's first group is sent
        # evaluation (coordinator/evaluation.py): eval prompts run alone in the engine, with their own sampling
        self.eval_sampling = eval_sampling  # None: this run has no evaluation
        self.evaluating: EvalAssign | None = None
        self.eval_groups: list[EvalGroup] = []
        self.train_sampling: Any = None
        self.max_staleness = max_staleness  # k (run.mode bounded): the target is then v_{e-k}, the floor
        # bounded mode's pull policy (weights/pulls.py): what the coordinator announced, and an early pull
        self.sync_kl_threshold = sync_kl_threshold  # None: floor pulls only
        self.newest = -1  # the newest published version announced
        self.step_kls: dict[int, float] = {}  # i -> KL(v_i || v_{i+1}), as announced
        self.pull_due = False  # a drift pull is wanted: no more work, fetch once the engine is idle
        self.pull_reason = ""  # why the fetch in flight was sent (floor | drift)
        self.stale_weights = False  # the core restarted: the weights held are fetched again first
        self.evals = Evaluation(self)  # evaluating.py
        self.weights = Weights(self)  # weights.py: fetches, pulls, installs

    def start(self, now: float) -> None:
        self.register()

    def heartbeat(self) -> Heartbeat | None:
        if not self.registered:
            return None
        return Heartbeat(
            epoch=self.epoch, version=self.engine.version, busy_groups=sorted(self.assigned), refused=self.refused
        )

    def request_stop(self, reason: str) -> None:
        """Graceful leave: the coordinator requeues whatever we held."""
        self.log("stop_requested", reason=reason)
        self.emit(Dest.peer("coordinator"), Leave(reason=reason))
        self.stopped = True

    # --- what the coordinator says ---------------------------------------------------------------

    def on_welcome(self, now: float, inbound: Inbound[Welcome]) -> None:
        run = inbound.msg.contract
        why = refusal(self.name, self.contract, run) if run is not None and self.contract is not None else None
        if why is not None:  # the coordinator refuses such a worker; a welcome that says otherwise changes nothing
            self.fail(f"cannot join run {inbound.msg.run_id}: {why}")
            return
        restarted = bool(self.run_id) and inbound.msg.run_id != self.run_id
        super().on_welcome(now, inbound)
        self.run_id = inbound.msg.run_id
        if restarted:
            self._core_restarted(inbound.msg.run_id)
        self.weights.learn_target(inbound.msg.version)

    def _core_restarted(self, run_id: str) -> None:
        """We joined a new core (another run id: `up` restarted the core from its last checkpoint,
        run.max_restarts). What the old core gave us is void (its tickets died with it): the running
        batch, eval prompts, requests and fetches are dropped. Our weights may be of a version the
        new core has not made again (it went back to its checkpoint), so they are fetched anew
        before any work (`stale_weights`), and the target is the new core's, not the higher of both."""
        self.log("core_restarted", run_id=run_id, held=self.engine.version, groups=sorted(self.assigned))
        if self.evaluating is not None:
            self.evaluating, self.eval_groups = None, []
            self.evals.restore_sampling()
        if self.engine.busy:
            self.count("groups_dropped", len(self.engine.abort()))
        self.assigned.clear()
        self.requests.pending.clear()  # timeouts of requests to the old core: nothing to retry
        self.requesting, self.hold, self.retry_at = False, None, 0.0
        self.fetch.clear()
        self.target, self.stale_weights = -1, True

    @handles(EpochStart)
    def on_epoch_start(self, now: float, inbound: Inbound[EpochStart]) -> None:
        self.weights.learn_news(inbound.msg.newest, inbound.msg.step_kls)
        self.weights.learn_target(inbound.msg.version)

    def on_heartbeat_ack(self, now: float, inbound: Inbound[HeartbeatAck]) -> None:
        super().on_heartbeat_ack(now, inbound)
        if not inbound.msg.known:
            return
        pulling = self.pull_due
        self.weights.learn_news(inbound.msg.newest, inbound.msg.step_kls)
        if inbound.msg.version != self.target:
            self.weights.learn_target(inbound.msg.version)
        elif self.pull_due and not pulling:
            self._next()

    def _ask_again(self) -> None:
        self.hold = None
        self._next()

    def _next(self) -> None:
        """Decide the next step: fetch weights, ask for work, or wait. Work is asked for while the
        batch runs, up to the running batch plus `prefetch` queued groups, so freed rows never wait."""
        if not self.registered or self.target < 0 or self.requesting:
            return
        if self.evaluating is not None:  # eval prompts run alone in the engine: no training work meanwhile
            return
        if self.fetch.busy:  # a fetch is out: its reply (or its timeout in tick) decides what is next
            return
        if self.engine.version < self.target or self.stale_weights:
            self._drop_running("a newer epoch is open")
            self.weights.fetch("floor")
            return
        if self.pull_due:  # drain first: what runs was assigned for these weights and is within the bound
            if not self.engine.busy:
                self.weights.fetch("drift")
            return
        want = (self.engine.max_rows + self.prefetch * self.group_size - self.engine.rows) // self.group_size
        if want <= 0 or self.hold is not None:
            return
        eval_ok = self.eval_sampling is not None and not self.engine.busy
        req = WorkRequest(epoch=self.target, version=self.engine.version, max_groups=want, eval_ok=eval_ok)
        self.emit(Dest.peer("coordinator"), req)
        self.requesting = True
        self.expect(req, self.request_timeout_s, "work request", self._request_timed_out)

    def _drop_running(self, reason: str) -> None:
        """Empty the engine (one version per batch): under strict on-policy a newer epoch opens only
        once every group of the old one is accepted, so what still runs is done elsewhere."""
        if self.engine.busy:
            dropped = self.engine.abort()
            self.count("groups_dropped", len(dropped))
            self.log("batch_dropped", reason=reason, groups=sorted(dropped))
        self.assigned.clear()
        if self.evaluating is not None:  # hand the unfinished eval prompts back (the coordinator requeues them)
            self.evals.end()

    def _request_timed_out(self, now: float) -> None:
        self.requesting = False
        self._next()

    def tick(self, now: float) -> None:
        super().tick(now)
        self.fetch_failed(self.fetch.expired(now))
        fetch_due = self.fetch.due(now)
        if fetch_due or (self.retry_at and now >= self.retry_at):
            self.retry_at = 0.0
            self._ask_again()

    # --- weights ---------------------------------------------------------------------------------

    @handles(WeightsBegin)
    def on_weights_begin(self, now: float, inbound: Inbound[WeightsBegin]) -> None:
        if inbound.msg.shm_path:
            self.weights.load_shared(now, inbound.msg)
        else:
            super().on_weights_begin(now, inbound)

    def weights_arrived(self, now: float, snap: Snapshot, started: float) -> None:
        self.weights.install(snap, started, via="chunks")

    def on_error(self, now: float, inbound: Inbound[Error]) -> None:
        super().on_error(now, inbound)
        self.requesting = False
        self.fetch.refused(now)  # e.g. nothing published yet
        self.retry_at = now + 0.2

    # --- work ------------------------------------------------------------------------------------

    @handles(NoWork)
    def on_no_work(self, now: float, inbound: Inbound[NoWork]) -> None:
        self.requesting = False
        reason = inbound.msg.reason
        if reason == NoWorkReason.DONE:
            return
        if reason == NoWorkReason.STALE_VERSION:
            self.weights.learn_target(inbound.msg.version)
            return
        # queue_empty / no_epoch: the coordinator nudges us (EpochStart); fair_share: ask again once one
        # of our groups is acked (our share grows); either way poll slowly as a fallback
        self.hold = reason
        self.retry_at = now + max(inbound.msg.retry_after_s, 1.0)

    @handles(EvalAssign)
    def on_eval_assign(self, now: float, inbound: Inbound[EvalAssign]) -> None:
        """Eval prompts: run alone in the idle engine with the eval sampling settings; never trained."""
        msg = inbound.msg
        self.requesting = False
        runnable = self.eval_sampling is not None and not self.engine.busy and self.evaluating is None
        if not runnable or msg.version != self.engine.version:
            self.log("eval_refused", msg_version=msg.version, held=self.engine.version, busy=self.engine.busy)
            self.emit(Dest.peer("coordinator"), EvalResult(epoch=msg.epoch, version=msg.version, groups=[]))
            self._next()
            return
        self.evaluating, self.eval_groups = msg, []
        if hasattr(self.engine, "sampling"):  # the torch engine (the sim engine has no sampling settings)
            engine: Any = self.engine
            self.train_sampling, engine.sampling = engine.sampling, self.eval_sampling
        self.log("span_begin", span="eval", prompts=[p.group_id for p in msg.prompts], eval_epoch=msg.epoch)
        self.engine.admit(msg.prompts, msg.samples)
        self._kick()

    @handles(WorkAssign)
    def on_work_assign(self, now: float, inbound: Inbound[WorkAssign]) -> None:
        msg = inbound.msg
        self.requesting = False
        current = msg.version == self.engine.version and msg.version >= self.target
        if not current or not within_bound(msg.epoch, msg.version, self.max_staleness):  # its epoch is over
            self.log("assign_refused", reason="version mismatch", msg_version=msg.version, target=self.target)
            self._next()
            return
        self.epoch = msg.epoch
        self.assigned.update((p.group_id, (msg, p)) for p in msg.prompts)
        self.engine.admit(msg.prompts, self.group_size)
        self._kick()
        self._next()

    def _kick(self) -> None:
        """Queue an engine step unless one is queued (steps run as inbox items, between messages)."""
        if self.stepping or not self.engine.busy:
            return
        self.stepping, self.busy_since = True, time.monotonic()
        self.log("span_begin", span="generate", groups=sorted(self.assigned))
        self.defer(self._step)

    def _step(self, now: float) -> None:
        try:
            finished = self.engine.step()
        except Exception as exc:  # engine failure: hand the groups back by registering anew
            if self.evaluating is not None:  # eval prompts are not handed back: retrying could loop forever
                self.evals.failed(exc)
            else:
                self._engine_failed(exc)
            finished = []
        for event, fields in engine_notes(self.engine):  # e.g. which decode attention the model got
            self.log(event, **fields)
        if finished and self.evaluating is not None:
            self.evals.finished(finished)
        elif finished:
            self._finish(finished)
        if self.engine.busy:
            self.defer(self._step)
        else:
            self.stepping = False
            self.log("span_end", span="generate", seconds=round(time.monotonic() - self.busy_since, 6))
            if self.eval_sampling is not None and self.hold in (NoWorkReason.QUEUE_EMPTY, NoWorkReason.NO_EPOCH):
                self.hold = None  # idle now: eval prompts may be waiting for an idle engine
        self._next()

    def _finish(self, finished: list[GeneratedGroup]) -> None:
        """Score the groups that left the running batch and send each one on its own."""
        if self.threads is not None:
            self.threads.take_share()  # the trainer trains from now on
        self.log("span_begin", span="score", groups=[g.group_id for g in finished])
        entries = [(g, self.assigned.pop(g.group_id, None)) for g in finished]
        sent = [(g, e) for g, e in entries if e is not None]
        for i, (g, (msg, prompt)) in enumerate(sent):
            try:
                group = self._score(g, prompt)
            except Exception as exc:  # scoring itself raised (not a reward error handled in _score)
                self._give_back([g.group_id], "score", exc)
                continue
            if group is None:  # a reward failed under on_reward_error: fail; the run ends
                return
            out = GroupResult(epoch=msg.epoch, version=msg.version, group=group, ticket=prompt.ticket)
            out.follows = len(sent) - 1 - i  # the rest of this burst comes right after it
            self._send_group(out, 1)
        self.log("span_end", span="score")

    def _engine_failed(self, exc: Exception) -> None:
        """The engine raised: everything it ran is lost; give it all back to the coordinator at once."""
        groups = sorted(self.assigned)
        self.engine.abort()
        self.assigned.clear()
        self._give_back(groups, "generate", exc)
        if self.evaluating is not None:  # re-registering releases its eval prompts at the coordinator
            self.evaluating, self.eval_groups = None, []
            self.evals.restore_sampling()
            self.registered = False
            self.register()

    def _give_back(self, groups: list[int], stage: str, exc: Exception) -> None:
        """Tell the coordinator that `groups` failed (it requeues them, and gives up on a group that
        keeps failing: run.max_group_failures). Logged rate-limited: a failure that repeats every step
        cannot fill the disk (the count says how many)."""
        error = f"{stage}: {type(exc).__name__}: {exc}"[:500]
        n = self.count(f"{stage}_failed")
        if n <= LOUD_FIRST or n % LOUD_EVERY == 0:
            self.log(f"{stage}_failed", error=error, groups=groups, count=n)
        if groups:
            self.emit(
                Dest.peer("coordinator"), GiveBack(groups=groups, error=error, epoch=self.epoch, version=self.version)
            )

    def _send_group(self, out: GroupResult, attempt: int) -> None:
        """Send a group; without a GroupAck in time, send it again (the buffer dedups: retry, never skip)."""
        self.emit(Dest.peer("buffer"), out)
        gid = out.group.group_id
        self.log(
            "group_sent", group_id=gid, msg_id=out.id, msg_epoch=out.epoch, msg_version=out.version, attempt=attempt
        )
        if attempt < MAX_SEND_ATTEMPTS:
            retry = msgspec.structs.replace(out, id=new_id(), follows=0)
            self.expect(
                out,
                self.request_timeout_s,
                f"buffer ack of group {gid}",
                lambda now: self._send_group(retry, attempt + 1),
            )

    def _score(self, g: GeneratedGroup, prompt: Prompt) -> Group | None:
        """The group with its rewards (rewards/: weighted parts, async rewards concurrent). A reward
        error ends the run with its one line (`task.on_reward_error: fail`, returns None) or scores
        0 and is counted and logged (`zero`)."""
        try:
            scored = self.task.score_generated(prompt, g.prompt_ids, g.samples)
        except RewardStopped as exc:  # this process is stopping (plugins.STOPPING): no value, no failure
            self.log("reward_abandoned", error=str(exc), group_id=g.group_id)
            return None
        except RewardError as exc:
            self.log("reward_failed", error=str(exc), traceback=exc.trace, group_id=g.group_id)
            self.fail(str(exc))
            return None
        for error in scored.errors:
            loud, n = self.count_loud("reward_errors"), self.counters["reward_errors"]
            if loud:
                self.log("reward_error", error=error, traceback=scored.traces.get(error, ""), count=n, policy="zero")
            if math.log10(n).is_integer():  # the console hears of the 1st, 10th, 100th ...
                console(f"warning: {self.name}: scored 0 (task.on_reward_error: zero), {n} so far: {error}")
        parts = self.task.reward_set().report_parts
        samples = [
            Sample(
                text=s.text,
                token_ids=s.token_ids,
                logprobs=s.logprobs,
                reward=total + self.task.length_penalty(len(s.token_ids)),
                finished=s.finished,
                loss_mask=s.loss_mask or [],
                reward_parts=part if parts else {},
                episode=getattr(s, "episode", None),  # multi-turn: turns, tool calls (engines/multiturn.py)
            )
            for s, total, part in zip(g.samples, scored.totals, scored.parts, strict=True)
        ]
        return Group(
            group_id=g.group_id,
            prompt=g.prompt,
            prompt_ids=g.prompt_ids,
            samples=samples,
            worker=self.name,
            gen_s=g.gen_s,
        )

    @handles(GroupAck)
    def on_group_ack(self, now: float, inbound: Inbound[GroupAck]) -> None:
        msg = inbound.msg
        self.count("groups_accepted" if msg.accepted else f"groups_rejected.{msg.reason}")
        if self.hold == NoWorkReason.FAIR_SHARE:
            self._ask_again()

    def close(self) -> None:
        self.engine.close()
