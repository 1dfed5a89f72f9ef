"""Stall watch, a part of the coordinator: no silent hang, and no run waiting for good on workers
that were all expelled.

While the run makes no progress (phase, epoch, groups done, eval prompts done), it says every
STALL_LOG_S why it waits (`stalled`, and `CoordinatorCore.stall_reason` for Status); the first
weights get FIRST_WEIGHTS_GRACE_S (the trainer starts, imports torch and loads the model)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.protocol.messages import Phase, Role
from prl_actors.protocol.versions import version_for, within_bound

if TYPE_CHECKING:
    from prl_actors.coordinator.core import CoordinatorCore

STALL_LOG_S = 10.0  # how often a stalled coordinator says why it waits
# The first weights wait on the trainer loading (or building) the model: normal for a while, not a stall.
FIRST_WEIGHTS_GRACE_S = 60.0


class StallWatch:
    def __init__(self, core: CoordinatorCore) -> None:
        self.core = core
        self.progress: tuple[Phase, int, int, int] = (Phase.DONE, -1, -1, -1)
        self.progress_at = 0.0

    def orphaned(self, now: float) -> str:
        """Why the run ends now ('' when it does not): workers were expelled and none is left, the open
        epoch (or an evaluation) waits for groups, and no worker joined within expelled_wait_s of the
        last expulsion. Expelled names cannot come back (`up` does not replace them), so without this
        a run whose every worker was expelled waited for good."""
        c = self.core
        if not c.expelled or c.members.of_role(Role.WORKER) or now - c.expelled_at < c.s.expelled_wait_s:
            return ""
        if not (c.phase.is_(Phase.RUNNING) or c.evals.blocks()):
            return ""
        names = ", ".join(sorted(c.expelled)[:4]) + ("..." if len(c.expelled) > 4 else "")
        return (
            f"failed: no worker is left to generate the run's groups: {names} expelled (last: {c.expelled_why}), "
            f"and none joined within {c.s.expelled_wait_s:g}s"
        )

    def watch(self, now: float) -> None:
        """In every state but done, while the run makes no progress, say every STALL_LOG_S why we wait."""
        c = self.core
        progress = (c.phase.current, c.epoch, len(c.work.done), len(c.eval_work.done))
        if progress != self.progress:
            self.progress, self.progress_at, c.stall_reason = progress, now, ""
            return
        if c.phase.is_(Phase.DONE) or now - self.progress_at < self.after():
            return
        self.progress_at = now
        reason = self.reason()
        c.log("stalled", reason=reason, state=c.phase.current, queued=len(c.work.queue), held=len(c.work.holder))
        c.stall_reason = reason

    def after(self) -> float:
        """Seconds without progress before a stall is reported: longer for the first weights (the
        trainer starts, imports torch and loads the model), so a normal start prints no `stalled:`."""
        first = self.core.phase.is_(Phase.WAITING_WEIGHTS) and self.core.available_version < 0
        return FIRST_WEIGHTS_GRACE_S if first else STALL_LOG_S

    def reason(self) -> str:
        c = self.core
        if c.evals.blocks():
            return (
                f"waiting for the evaluation of v{version_for(c.eval_epoch)}: {len(c.eval_work.holder)} "
                f"eval prompts held by workers, {len(c.eval_work.queue)} queued"
            )
        if c.phase.is_(Phase.TRAINING):
            want = c.opening.floor(c.epoch + 1)
            return f"waiting for the trainer's step of epoch {want - 1} (weights v{want}: publisher weights_available)"
        if c.phase.is_(Phase.WAITING_WEIGHTS):
            if not c.members.of_role(Role.TRAINER):
                return "waiting for the trainer's weights: no trainer has registered"
            return "waiting for the trainer's weights (publisher: weights_available)"
        if c.phase.is_(Phase.OPENING):
            return "waiting for the buffer to ack epoch_open"
        workers = c.members.of_role(Role.WORKER)
        if not workers:
            return "no worker is registered"
        behind = [m.name for m in workers if not within_bound(c.epoch, m.version, c.opening.bound(c.epoch))]
        if len(behind) == len(workers):
            return f"every worker still holds an older version ({', '.join(sorted(behind)[:4])})"
        return f"{len(c.work.holder)} groups held by workers{self.holders()}, {len(c.work.queue)} queued"

    def holders(self) -> str:
        """(worker-0: 3, worker-1: 2): who holds the open epoch's groups, the most first (4 named)."""
        counts: dict[str, int] = {}
        for w in self.core.work.holder.values():
            counts[w] = counts.get(w, 0) + 1
        if not counts:
            return ""
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        named = ", ".join(f"{w}: {n}" for w, n in top[:4]) + (", ..." if len(top) > 4 else "")
        return f" ({named}; deadline {self.core.hold_deadline_s():.0f}s)"
