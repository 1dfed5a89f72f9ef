"""The learner interface the Trainer actor drives.

Per epoch: `begin_epoch`, then `accumulate` once per group in arrival order (the group is queued;
forward + backward run when the queue reaches the micro-batch budget, gradients summed, never
stepped), `flush` whenever the trainer would otherwise idle (what is queued is trained now), then
exactly one `step` (which flushes first). The loss normalisation must not depend on arrival order or
on how groups were batched: accumulate un-normalised sums and divide by the epoch's totals in `step`.
With trainer.num_minibatches M > 1 the GRPO learner may also take optimizer steps inside `accumulate`
(minibatches fixed by group index); `step` still publishes exactly one new version.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Group


class Learner(Protocol):
    @property
    def version(self) -> int:
        """Version of the current policy weights; `step` increments it by exactly one."""
        ...

    def begin_epoch(self, epoch: int, n_groups: int) -> None: ...

    def accumulate(self, group: Group) -> dict[str, float]:
        """Queue one group (forward/backward once the micro-batch budget is reached); per-group stats."""
        ...

    def flush(self, max_groups: int | None = None) -> int:
        """Forward/backward the queued groups now (every one, or at least one and at most
        `max_groups`, in arrival order); returns how many were trained."""
        ...

    @property
    def pending(self) -> int:
        """Groups queued and not trained yet."""
        ...

    def step(self) -> dict[str, float]:
        """The epoch's last optimizer step(s), version + 1; returns the epoch's metrics (reward_mean, loss, ...)."""
        ...

    def weights(self) -> Mapping[str, Any]:
        """Named tensors of the policy (numpy or torch, CPU) to publish as `version`."""
        ...

    def save_checkpoint(self, path: Path) -> None: ...

    def load_checkpoint(self, path: Path) -> None: ...


@runtime_checkable
class IsolatingLearner(Protocol):
    """A learner whose failed micro-batch the trainer can retry group by group (training/guard.py):
    `drop_pending` forgets the queue, `train_one` trains exactly one group now, `forget` takes a
    refused group's stats out of the epoch."""

    def drop_pending(self) -> None: ...

    def train_one(self, group: Group) -> object: ...

    def forget(self, group: Group) -> None: ...


@runtime_checkable
class NonfiniteGuard(Protocol):
    """A learner that checks its loss and gradients before the step (trainer.on_nonfinite)."""

    def nonfinite_cause(self) -> str:
        """Why the epoch's step must not happen (a non-finite loss or gradient), or ""."""
        ...

    def skip_step(self) -> dict[str, float]:
        """No update, gradients dropped, version + 1; the epoch's metrics with `skipped`."""
        ...


@runtime_checkable
class ClosingLearner(Protocol):
    """A learner that holds resources (a trainer rank group) and releases them on `close`."""

    def close(self) -> None: ...


@runtime_checkable
class FatalReporting(Protocol):
    """A learner that can fail its actor from outside a call (a trainer group's lost rank):
    the trainer sets `on_fatal` to its `fail`."""

    on_fatal: Callable[[str], None]
