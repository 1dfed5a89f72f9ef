"""Trainer: consumes the buffer's stream in arrival order, one published version per epoch.

Per epoch: EpochOpen -> `learner.begin_epoch`; each TrainGroup -> `learner.accumulate` (queued; forward
and backward, no step, once a micro-batch is full) and one credit back to the buffer, and a `flush` as a
later inbox item: groups that arrived meanwhile are trained together (up to the micro-batch budget), and
the trainer never idles with groups queued while others are still generated. Once the buffer says the
epoch is generated (TrainGroup.generated: every group left is on its way), no more early flushes: the
rest is trained in micro-batches as big as the budget allows. Those decisions (and the hand-over of the
host's cores under `threads: auto`) are trainer/scheduling.py's TrainerSchedule. With
trainer.num_minibatches M > 1 the learner itself steps a minibatch (groups fixed by index) once its
groups are in, inside `accumulate` (training/grpo.py). EpochComplete -> exactly one `learner.step` (the
epoch's remaining optimizer steps, M x mu in all; version v_e -> v_{e+1}), the epoch's metrics row,
a checkpoint, the upload of v_{e+1} to the publisher and, once the publisher has stored it, StepDone to
the coordinator. The row goes before the checkpoint: whatever kills the trainer, publisher or core
after the checkpoint, the epoch it marks done has its row (a resume drops rows past its checkpoint).
Checkpoints and metrics go to an injected `TrainerSink` (the run directory in a run): the core itself
touches no file.
A TrainGroup whose version is not the learner's current version is refused (`train_rejected`): the
on-policy invariant is enforced here a second time, not only in the buffer. Under run.mode bounded
(k = run.max_staleness) a group of the open epoch e generated with v_{e-k} .. v_e is trained
(`versions.within_bound`; the learner corrects it by trainer.is_correction), and each epoch's metrics
row carries its staleness histogram (`staleness_j`: groups generated j versions behind).
Failure isolation (training/guard.py): when a forward/backward raises, no queued group is lost: each
group not yet trained is retried alone; one that fails alone is refused (`train_refused`, GroupRefused
to the buffer, which requeues it through the coordinator, counted against the group, not its worker)
and the rest is trained. Every trained group is logged in `groups_trained` with its tokens (replay
checks them against what was received).
A learner without isolation, or one whose every retried group fails, fails the actor loudly.
Before the step: a non-finite loss or gradient fails the actor (trainer.on_nonfinite fail: nothing
is stepped, published or checkpointed) or skips the step (skip). Each epoch reports the share of
groups with equal rewards (zero advantage: no learning signal) and warns when nothing was learned.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prl_actors.protocol.messages import (
    Credit,
    EpochComplete,
    EpochOpen,
    EpochStart,
    Error,
    Group,
    GroupRefused,
    RejectReason,
    Role,
    Shutdown,
    StepDone,
    TrainGroup,
    WeightsBegin,
    WeightsEnd,
    WeightsStored,
    Welcome,
)
from prl_actors.protocol.versions import on_policy, staleness, version_for, within_bound
from prl_actors.records.rundir import CompletionSink, FinalModelSink, RollbackSink, WarningSink
from prl_actors.rewards.metrics import RewardMeans
from prl_actors.runtime.core import Core, handles, one_line
from prl_actors.runtime.faults import kill_point
from prl_actors.trainer.completions import CompletionPicker
from prl_actors.trainer.scheduling import TrainerSchedule
from prl_actors.training.base import ClosingLearner, IsolatingLearner, NonfiniteGuard
from prl_actors.training.drift import PROBE_GROUPS, epoch_start_model, probe_logprobs, step_kl
from prl_actors.transport.port import Dest, Inbound
from prl_actors.weights.shm import ShmReader, ShmUnavailable, write_snapshot
from prl_actors.weights.tensors import pack
from prl_actors.weights.transfer import Snapshot, transfer_messages

if TYPE_CHECKING:
    from prl_actors.records.logs import EventLog
    from prl_actors.records.rundir import TrainerSink
    from prl_actors.runtime.threads import ThreadPlan
    from prl_actors.training.base import Learner

T = TypeVar("T")


class TrainerCore(Core):
    role = Role.TRAINER
    # learner failures are isolated (_learn); any other exception would leave the epoch waiting for a
    # step that never comes: the trainer fails, naming the message and the cause, and `up` ends the run
    fatal_errors = True

    def __init__(
        self,
        name: str,
        log: EventLog,
        learner: Learner,
        sink: TrainerSink,
        credits: int,
        chunk_bytes: int,
        request_timeout_s: float,
        checkpoint_every: int = 1,
        resume: bool = False,
        threads: ThreadPlan | None = None,
        shm: ShmReader | None = None,
        on_nonfinite: str = "fail",
        no_signal_epochs: int = 3,
        log_completions: int = 0,
        max_staleness: int = 0,
        drift_probe: bool = False,
    ) -> None:
        super().__init__(name, log)
        self.on_nonfinite, self.no_signal_epochs = on_nonfinite, no_signal_epochs
        self.untrained: list[TrainGroup] = []  # received, queued in the learner, not trained yet (in order)
        self.zero_groups = 0  # groups of the epoch whose rewards were all equal (zero advantage)
        self.no_signal_run = 0  # epochs in a row without any learning signal
        self.completions = CompletionPicker(log_completions) if log_completions > 0 else None
        self.schedule = TrainerSchedule(threads)  # when to train, on how many threads (trainer/scheduling.py)
        self.max_staleness = max_staleness  # k (run.mode bounded); 0 = strict on-policy
        self.stale: dict[int, int] = {}  # staleness j -> groups of the open epoch (bounded mode)
        # worker.sync_kl_threshold (bounded mode): each step's KL(v_e || v_{e+1}) on a probe (training/drift.py)
        self.drift_probe = drift_probe
        self.probe: list[Group] = []  # the open epoch's first PROBE_GROUPS groups
        self.learner, self.sink = learner, sink
        self.credits, self.chunk_bytes = credits, chunk_bytes
        self.request_timeout_s, self.checkpoint_every = request_timeout_s, checkpoint_every
        self.resume = resume
        self.consumed = self.groups = 0
        self.t_open = 0.0
        self.train_s = 0.0
        self.t_upload = 0.0
        # weight version uploaded -> (epoch, metrics) of the step that made it: the publisher's
        # WeightsStored of one step can arrive after the next epoch was trained (other sockets first)
        self.finished: dict[int, tuple[int, dict[str, float]]] = {}
        self.flush_queued = False
        self.shm = shm  # same-host uploads through /dev/shm (weights/shm.py); None: chunks only
        self.run_id = ""
        self.shared_upload_id = ""  # the id of the last upload if it went through /dev/shm
        self.reward_means = RewardMeans()  # reward/<name> of the open epoch (task.rewards)

    def start(self, now: float) -> None:
        if self.resume:  # a damaged or unloadable checkpoint raises: the actor fails to start, loudly
            ckpt = self.sink.latest_checkpoint(on_skip=self._checkpoint_skipped)
            if ckpt is not None:
                self.learner.load_checkpoint(ckpt)
            # also without one (a core restarted before the first checkpoint): replay drops what the
            # dead core trained past this version (replay/invariants.py `_kept`)
            self.log("resumed", checkpoint=str(ckpt or ""), new_version=self.learner.version)
            if isinstance(self.sink, RollbackSink):  # epochs past the checkpoint (a damaged newer one) are redone
                self.sink.rollback(self.learner.version)
        self.version = self.learner.version
        self.register()
        self.emit(Dest.peer("buffer"), Credit(n=self.credits))
        self._upload()

    def _checkpoint_skipped(self, path: Path, why: str) -> None:
        self.log("checkpoint_skipped", path=str(path), reason=why)

    @handles(EpochStart)
    def on_epoch_start(self, now: float, inbound: Inbound[EpochStart]) -> None:
        pass  # the buffer's stream (EpochOpen) is what drives training

    # --- the stream --------------------------------------------------------------------------

    @handles(EpochOpen)
    def on_epoch_open(self, now: float, inbound: Inbound[EpochOpen]) -> None:
        msg = inbound.msg
        if msg.version != self.learner.version or not on_policy(msg.epoch, msg.version):
            self.log("train_rejected", reason="epoch version is not the learner's", msg_version=msg.version)
            return
        self.epoch, self.consumed, self.groups = msg.epoch, 0, msg.groups
        self.untrained, self.zero_groups = [], 0
        self.t_open, self.train_s = now, 0.0
        self.schedule.open_epoch()
        self.learner.begin_epoch(msg.epoch, msg.groups)
        self.reward_means.reset()
        self.stale, self.probe = {}, []
        self.log("train_epoch_begin", groups=msg.groups)

    @handles(TrainGroup)
    def on_train_group(self, now: float, inbound: Inbound[TrainGroup]) -> None:
        msg = inbound.msg
        self.emit(Dest.peer("buffer"), Credit(n=1))
        if not self._trainable(msg.epoch, msg.version):
            self.count("train_rejected")
            self.log("train_rejected", reason="off-policy", group_id=msg.group.group_id, msg_version=msg.version)
            return
        self.schedule.group_arrived(msg.generated or self.consumed + 1 == self.groups)  # the rest is on its way?
        j = staleness(msg.epoch, msg.version)
        self.stale[j] = self.stale.get(j, 0) + 1
        if self.drift_probe and len(self.probe) < PROBE_GROUPS:
            self.probe.append(msg.group)
        if self.completions is not None:  # run.log_completions (prl_actors/trainer/completions.py)
            self.sink_completions(self.completions.rows(msg.epoch, msg.version, self.groups, msg.group))
        stats: dict[str, float] = {}
        self.reward_means.add(msg.group)
        self.consumed += 1
        self.untrained.append(msg)
        rewards = [s.reward for s in msg.group.samples]
        self.zero_groups += bool(rewards) and max(rewards) == min(rewards)
        self._learn(lambda: stats.update(self.learner.accumulate(msg.group)), group_id=msg.group.group_id, seq=msg.seq)
        self.log(
            "train_group",
            group_id=msg.group.group_id,
            seq=msg.seq,
            worker=msg.group.worker,
            msg_id=msg.id,
            msg_epoch=msg.epoch,
            msg_version=msg.version,
            samples=len(msg.group.samples),
            received_tokens=sum(len(s.token_ids) for s in msg.group.samples),
            **{k: round(v, 6) for k, v in stats.items()},
        )
        if self.learner.pending and not self.flush_queued and self.schedule.flush_early():
            self.flush_queued = True
            self.defer(self._flush)

    def _trainable(self, epoch: int, version: int) -> bool:
        """A TrainGroup of the open epoch, whose epoch is the learner's (v_e), generated with weights
        within the bound (strict on-policy when k = 0: version == v_e)."""
        own = version_for(epoch) == self.learner.version
        return epoch == self.epoch and own and within_bound(epoch, version, self.max_staleness)

    def _flush(self, now: float) -> None:
        """Train what is queued: every TrainGroup that arrived before this item has been queued, up to
        the schedule's limit (a paced flush while a hand-over is to come, trainer/scheduling.py); what
        is left is deferred behind the inbox."""
        self.flush_queued = False
        queued = self.learner.pending
        if not queued:
            return
        limit = self.schedule.flush_limit()
        t0 = time.monotonic()
        trained = self._learn(lambda: self.learner.flush(limit), groups=min(queued, limit or queued))
        self.schedule.flushed(limit, trained, time.monotonic() - t0)
        if self.learner.pending and not self.flush_queued:
            self.flush_queued = True
            self.defer(self._flush)

    def _train(self, work: Callable[[], T], **fields: Any) -> T:
        """Run learner work inside a `train` span (the trainer's busy time in replay and benchmarks)."""
        self.log("span_begin", span="train", **fields)
        t0 = time.monotonic()
        out = work()
        dt = time.monotonic() - t0
        self.train_s += dt
        self.log("span_end", span="train", seconds=round(dt, 6))
        return out

    # --- failure isolation (training/guard.py) -----------------------------------------------

    def _learn(self, work: Callable[[], Any], **fields: Any) -> int:
        """Learner work that may train queued groups; returns how many it trained. On an exception
        the groups not yet trained are isolated (retried alone) instead of lost."""
        try:
            self._train(work, **fields)
        except Exception as exc:
            self._isolate(exc)
            return 0
        return self._settle()

    def _settle(self) -> int:
        """Log the groups the learner trained since the last call (those no longer pending)."""
        n = len(self.untrained) - self.learner.pending
        done, self.untrained = self.untrained[:n], self.untrained[n:]
        if done:
            self._trained(done)
        return n

    def _trained(self, done: list[TrainGroup]) -> None:
        tokens = [sum(len(s.token_ids) for s in m.group.samples) for m in done]
        self.log("groups_trained", groups=[m.group.group_id for m in done], tokens=tokens, msg_epoch=self.epoch)

    def _isolate(self, exc: Exception) -> None:
        suspects, self.untrained = self.untrained, []
        cause = one_line(exc)
        self.count("train_failed")
        self.log("train_failed", error=cause, groups=[m.group.group_id for m in suspects])
        learner = self.learner
        if not isinstance(learner, IsolatingLearner):
            self.fail(f"training epoch {self.epoch} failed: {cause} (this learner cannot retry groups alone)")
            return
        learner.drop_pending()
        refused = 0
        for m in suspects:
            try:
                self._train(partial(learner.train_one, m.group), group_id=m.group.group_id)
            except Exception as alone:
                learner.forget(m.group)
                self._refuse(m, one_line(alone))
                refused += 1
            else:
                self._trained([m])
        if refused > 1 and refused == len(suspects):
            self.fail(f"training epoch {self.epoch} failed for every group ({refused}), not one bad group: {cause}")

    def _refuse(self, m: TrainGroup, error: str) -> None:
        """`m` cannot be trained: it is not consumed; the buffer and coordinator have it generated again."""
        self.consumed -= 1
        gid = m.group.group_id
        self.count("train_refused")
        self.log("train_refused", group_id=gid, msg_id=m.id, msg_epoch=m.epoch, worker=m.group.worker, error=error)
        refused = GroupRefused(
            epoch=m.epoch,
            version=m.version,
            group_id=gid,
            worker=m.group.worker,
            reason=RejectReason.TRAIN_FAILED,
            detail=error[:300],
        )
        self.emit(Dest.peer("buffer"), refused)

    def _guarded_step(self) -> dict[str, float] | None:
        """The epoch's step, unless the loss or a gradient is non-finite (trainer.on_nonfinite)."""
        learner = self.learner
        cause = learner.nonfinite_cause() if isinstance(learner, NonfiniteGuard) else ""
        if not cause:
            return learner.step()
        self.count("nonfinite")
        self.log("step_nonfinite", cause=cause, policy=self.on_nonfinite)
        if self.on_nonfinite == "skip":
            assert isinstance(learner, NonfiniteGuard)  # a cause came from its nonfinite_cause
            return learner.skip_step()
        self.fail(f"epoch {self.epoch}: {cause}; no step taken, no weights published (trainer.on_nonfinite: fail)")
        return None

    def _signal(self, metrics: dict[str, float]) -> None:
        """Per-epoch share of zero-advantage groups; a warning when the epoch learned nothing."""
        share = self.zero_groups / max(self.consumed, 1)
        metrics["zero_adv_share"] = round(share, 6)
        if share < 1.0:
            self.no_signal_run = 0
            return
        self.no_signal_run += 1
        self.log("no_signal", epochs_in_a_row=self.no_signal_run)
        if not isinstance(self.sink, WarningSink):
            return
        warn = self.sink.warn
        if self.no_signal_run == self.no_signal_epochs:
            warn(
                f"warning: {self.no_signal_run} epochs in a row without learning signal: every group had equal "
                "rewards (zero advantage), so nothing is learned; check the reward, the task's difficulty and "
                "worker.sampling.temperature"
            )
        elif self.no_signal_run < self.no_signal_epochs:
            warn(f"warning: epoch {self.epoch} had no learning signal (every group had equal rewards)")

    @handles(EpochComplete)
    def on_epoch_complete(self, now: float, inbound: Inbound[EpochComplete]) -> None:
        msg = inbound.msg
        t_in = time.monotonic()  # the row's wall_s: from the open to the row's writing (`now` + this handler)
        if msg.epoch == self.epoch and self.learner.pending:
            self._learn(lambda: self.learner.flush())
        if msg.epoch != self.epoch or self.consumed != msg.groups:
            self.log("step_refused", reason=f"consumed {self.consumed} of {msg.groups} groups", msg_epoch=msg.epoch)
            return
        before = self.learner.version
        self.log("span_begin", span="optimizer_step")
        t0 = time.monotonic()
        probed = self._probe(before=True)
        stepped = self._guarded_step()
        if stepped is None:
            return
        metrics = stepped
        if self.drift_probe and self.probe:  # bounded mode's drift signal (weights/pulls.py), -1: unknown
            after = self._probe(before=False) if probed is not None else None
            metrics["step_kl"] = round(step_kl(probed, after), 9) if after is not None else -1.0
        self._signal(metrics)
        step_s = time.monotonic() - t0
        self.train_s += step_s
        self.version = self.learner.version
        inner = int(metrics.get("optimizer_steps", 1))  # M x mu (the sim learner: 1)
        self.log(
            "optimizer_step",
            version_before=before,
            version_after=self.learner.version,
            groups=self.consumed,
            optimizer_steps=inner,
        )
        self.log("span_end", span="optimizer_step", seconds=round(step_s, 6))
        self._epoch_metrics(msg, metrics, wall=now - self.t_open + time.monotonic() - t_in)
        kill_point(self.name, "before_checkpoint", self.epoch)
        self._checkpoint()
        kill_point(self.name, "after_checkpoint", self.epoch)
        # the next EpochOpen may overtake the publisher's WeightsStored: keep this epoch's numbers apart
        self.finished[self.learner.version] = (self.epoch, metrics)
        self._upload()

    def _epoch_metrics(self, msg: EpochComplete, metrics: dict[str, float], wall: float) -> None:
        """The epoch's metrics row, written before the checkpoint that marks the epoch done: a crash
        after the checkpoint keeps the row (the epoch is not redone), a crash before it leaves a row
        that the resume's `rollback` drops (the epoch is redone). `metrics` (what StepDone carries)
        gets the epoch's reward means, times and histograms too."""
        metrics.update(self.reward_means.metrics())
        metrics.update(gen_s=msg.gen_s, train_s=round(self.train_s, 6))
        if self.max_staleness:  # bounded mode: the epoch's staleness histogram
            metrics.update({f"staleness_{j}": float(n) for j, n in sorted(self.stale.items())})
        if msg.generated:  # dynamic sampling: groups kept (trained) of those generated, and B
            kept, made, wanted = float(self.consumed), float(msg.generated), float(self.groups)
            metrics.update(groups_kept=kept, groups_generated=made, groups_target=wanted)
        row = {**metrics, "epoch": self.epoch, "version": self.learner.version}
        row.update(wall_s=round(wall, 6), samples_per_s=round(metrics.get("samples", 0.0) / max(wall, 1e-9), 3))
        self.log("epoch_metrics", **row)
        self.sink.epoch_metrics(row)

    def _probe(self, before: bool) -> Any:
        """[N] log-probs of the probe's tokens under the epoch-start policy (before the step) or the
        new one (after); None without a drift probe, or when scoring the probe failed (training/drift.py)."""
        if not self.drift_probe or not self.probe:
            return None
        try:
            model = epoch_start_model(self.learner) if before else None
            return probe_logprobs(self.learner, self.probe, model)
        except Exception as exc:  # a signal, not training: the step goes on, its KL is unknown (-1)
            self.count("drift_probe_failed")
            self.log("drift_probe_failed", error=one_line(exc), before=before)
            return None

    # --- weights out -------------------------------------------------------------------------

    def _upload(self) -> None:
        """Send the learner's weights to the publisher: through a /dev/shm file when the publisher
        shares this host (proved by its host file, weights/shm.py), else as chunks."""
        self.log("span_begin", span="weight_upload")
        self.t_upload = time.monotonic()
        weights = self.learner.weights()
        first = self._upload_shared(weights) if self.shm is not None else None
        if first is None:
            snap = Snapshot.from_tensors(self.learner.version, weights)
            for part, payloads in transfer_messages(snap, self.chunk_bytes, epoch=self.epoch):
                first = first or part
                self.emit(Dest.peer("publisher"), part, payloads)
        assert first is not None
        self.shared_upload_id = first.id if first.shm_path else ""
        self.expect(first, self.request_timeout_s, "publisher stores weights", lambda now: self._upload())

    def _upload_shared(self, weights: Mapping[str, Any]) -> WeightsBegin | None:
        """Write the version's file where the publisher reads it; None when this host cannot."""
        assert self.shm is not None
        if not self.shm.proof(self.run_id):  # not the publisher's host (or it has no shared memory)
            return None
        metas, views = pack(weights)
        try:
            path = write_snapshot(self.shm.root, self.run_id, self.learner.version, views)
        except ShmUnavailable as exc:
            self.log("shm_unavailable", reason=str(exc), new_version=self.learner.version)
            return None
        total = sum(m.nbytes for m in metas)
        begin = WeightsBegin(epoch=self.epoch, version=self.learner.version, tensors=metas, total_bytes=total, chunks=0)
        begin.shm_path = str(path)
        self.emit(Dest.peer("publisher"), begin)
        self.emit(Dest.peer("publisher"), WeightsEnd(epoch=self.epoch, version=self.learner.version, transfer=begin.id))
        return begin

    def on_error(self, now: float, inbound: Inbound[Error]) -> None:
        super().on_error(now, inbound)
        if self.shm is not None and inbound.msg.reply_to and inbound.msg.reply_to == self.shared_upload_id:
            self.log("shm_refused", reason=inbound.msg.detail)  # the publisher refused the file
            self.shm = None  # chunks from now on; a refused chunked upload is not retried (as before)
            self._upload()

    def on_welcome(self, now: float, inbound: Inbound[Welcome]) -> None:
        super().on_welcome(now, inbound)
        self.run_id = inbound.msg.run_id

    @handles(WeightsStored)
    def on_weights_stored(self, now: float, inbound: Inbound[WeightsStored]) -> None:
        self.log("span_end", span="weight_upload", seconds=round(now - self.t_upload, 6))
        finished = self.finished.pop(inbound.msg.version, None)
        if finished is None:  # the initial (or resumed) weights: no epoch was trained
            return
        epoch, metrics = finished
        kill_point(self.name, "after_ack", epoch)
        self.emit(Dest.peer("coordinator"), StepDone(epoch=epoch, version=inbound.msg.version, metrics=metrics))

    def on_shutdown(self, now: float, inbound: Inbound[Shutdown]) -> None:
        """A completed run: first the final model in the model's dtype (RUN_DIR/final), then stop."""
        if inbound.msg.reason == "completed":
            self._final_model()
        super().on_shutdown(now, inbound)

    def _final_model(self) -> None:
        """The learner's published weights (model.dtype) as RUN_DIR/final; a failure is logged, the
        run's checkpoints stay."""
        if not isinstance(self.sink, FinalModelSink):
            return
        final = self.sink.final_model

        def write(out: Path, model_dir: Path) -> None:  # called only for a full model's checkpoint
            from prl_actors.training.checkpoint import export_final

            export_final(out, self.learner.weights(), model_dir)

        try:
            path = final(write)
        except Exception as exc:  # the final checkpoint is still there: `prl-actors export` reads it
            self.log("final_model_failed", error=one_line(exc))
            return
        if path is not None:
            self.log("final_model", path=str(path), new_version=self.learner.version)

    def close(self) -> None:
        """A learner that holds resources (a trainer rank group) releases them."""
        if isinstance(self.learner, ClosingLearner):
            self.learner.close()

    def sink_completions(self, rows: list[dict[str, Any]]) -> None:
        if rows and isinstance(self.sink, CompletionSink):
            self.sink.completions(rows)

    def _checkpoint(self) -> None:
        v = self.learner.version
        if not self.checkpoint_every or v % self.checkpoint_every:
            return
        path = self.sink.save_checkpoint(v, self.learner.save_checkpoint)
        if path is not None:
            self.log("checkpoint", path=str(path), new_version=v)
