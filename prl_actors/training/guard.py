"""Failure isolation and non-finite guards for the GRPO learner (the trainer actor drives them).

`GuardedGRPO` is mixed into GRPOLearner. The trainer calls these only after a learner call raised,
or right before the epoch's step:
- `drop_pending()`: forget the queue (what was in the failed micro-batch is retried by the trainer);
- `train_one(group)`: forward/backward exactly this group now (its reward stats were counted when
  it was accumulated: they are not counted again);
- `forget(group)`: a group the trainer refuses (it failed alone): its reward stats are taken out,
  so the epoch's metrics describe only trained groups;
- `nonfinite_cause()`: why the epoch's step must not happen (a non-finite loss or gradient), or "";
- `skip_step()`: trainer.on_nonfinite skip: no update, gradients dropped, version += 1.
Invariant: a forward that raises adds no gradient (backward never ran); a backward that raises part
way may leave partial gradients, so the trainer checks the gradients before every step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from prl_actors.training.epoch_stats import EpochStats

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Group


class GuardedGRPO:
    _pending: list[Group]
    _pending_tokens: int
    stats: EpochStats
    optimizer: torch.optim.Optimizer
    version: int
    policy: Any

    def _flush(self) -> None: ...  # provided by GRPOLearner

    def _cost(self, group: Group) -> int:  # provided by GRPOLearner
        raise NotImplementedError

    def _fold_stats(self) -> None: ...  # provided by GRPOLearner (the gpu impl's device-side metrics)

    def drop_pending(self) -> None:
        self._pending, self._pending_tokens = [], 0

    def train_one(self, group: Group) -> None:
        self._pending, self._pending_tokens = [group], self._cost(group)
        try:
            self._flush()
        finally:
            self._pending, self._pending_tokens = [], 0

    def forget(self, group: Group) -> None:
        rewards = [s.reward for s in group.samples]
        self.stats.groups -= 1
        self.stats.samples -= len(rewards)
        self.stats.reward_sum -= sum(rewards)
        self.stats.correct -= sum(r >= 1.0 for r in rewards)

    def nonfinite_cause(self) -> str:
        self._fold_stats()
        if not math.isfinite(self.stats.loss_sum):
            return f"loss {self.stats.loss_sum}"
        grads = [p.grad for p in self.policy.parameters() if p.grad is not None]
        if grads and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()):
            bad = next(
                n for n, p in self.policy.named_parameters() if p.grad is not None and not p.grad.isfinite().all()
            )
            return f"non-finite gradient in {bad}"
        return ""

    def skip_step(self) -> dict[str, float]:
        self._fold_stats()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        metrics = self.stats.metrics()
        self.stats = EpochStats()
        return {**metrics, "skipped": 1.0, "version": float(self.version)}
