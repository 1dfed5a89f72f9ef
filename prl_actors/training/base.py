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

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Group


class Learner(Protocol):
    version: int
    """Version of the current policy weights; `step` increments it by exactly one."""

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
