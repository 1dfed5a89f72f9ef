"""The trainer's schedule inside an epoch: when it trains what it holds, and on how many threads.

The actors carry facts; this module turns them into decisions (the buffer and the trainer ask it).

Facts (on the wire, true on any hardware; docs/PROTOCOL.md):
    GroupResult.follows    the worker sends this many more groups right after this one (its burst)
    TrainGroup.generated   every group of the epoch is accepted or announced by a burst (`Bursts`):
                           generation is over, nothing the trainer waits for is still to be made
    the epoch's last group the trainer counts it itself (consumed + 1 == B)

Decisions (`TrainerSchedule`):
    batching    until the epoch is generated, queued groups are trained by a flush queued behind the
                inbox (the trainer never idles while groups are still generated); once it is
                generated, the rest waits for the step, which trains it in micro-batches as large as
                the budget allows (one forward for a whole burst, not its first group alone)
    hand-over   only with a ThreadPlan (runtime/threads.py: `threads: auto` under `up`, one host): the
                trainer's share of the cores while its workers generate, every core once the epoch is
                generated (the workers then wait for weights), its share again at the next epoch
    pacing      only while that hand-over is still to come: a flush is cut to about SLICE_S of work and
                the rest deferred behind the inbox, so the epoch's last group (and every core with it)
                is read within a slice, not after a long forward on the share

The worker's side of the hand-over (every core from the epoch's weights until its first group is sent)
is its ThreadPlan's take_all / take_share at those two moments (worker/core.py). None of this changes
what is trained or in which order (micro-batching follows arrival; periodic == sync up to float
summation order): only when forwards run and on how many threads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prl_actors.runtime.threads import ThreadPlan

SLICE_S = 0.25  # a paced flush's work: at most about this long before the next group is read


class TrainerSchedule:
    """The trainer's decisions for the open epoch, from the facts it reads (module docstring).
    Invariant: `generated` never goes back to False within an epoch; with a ThreadPlan the trainer is
    on its share from `open_epoch` until the first generated group, then on every core."""

    def __init__(self, threads: ThreadPlan | None = None, slice_s: float = SLICE_S) -> None:
        self.threads, self.slice_s = threads, slice_s
        self.generated = False  # the open epoch's groups are all in the buffer or on their way to it
        self.group_s: float | None = None  # seconds per group of a paced flush (on the shared cores)

    def open_epoch(self) -> None:
        """A new epoch: its groups are still to be generated; the workers take the cores first."""
        self.generated = False
        if self.threads is not None:
            self.threads.take_share()

    def group_arrived(self, generated: bool) -> None:
        """A group of the open epoch, with whether every group left is on its way (TrainGroup.generated,
        or this one is the epoch's last)."""
        if generated:
            self.generated = True
            if self.threads is not None:
                self.threads.take_all()  # this host's workers now wait for weights

    def flush_early(self) -> bool:
        """Train queued groups before the step? Only while some of the epoch is still generated."""
        return not self.generated

    def flush_limit(self) -> int | None:
        """Groups one flush may train: about `slice_s` of work while the hand-over is still to come
        (one until a paced flush has been timed); None (all queued) otherwise."""
        if self.threads is None or not self.threads.boost_pending:
            return None
        return 1 if self.group_s is None else max(1, int(self.slice_s / self.group_s))

    def flushed(self, limit: int | None, trained: int, seconds: float) -> None:
        """A flush under `limit` trained `trained` groups in `seconds`: a paced one updates group_s."""
        if limit is None or not trained:
            return
        per_group = seconds / trained
        self.group_s = per_group if self.group_s is None else (self.group_s + per_group) / 2
