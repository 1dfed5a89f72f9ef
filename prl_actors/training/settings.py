"""What a GRPO learner reads of the run's config (launch/topology.py's `learner_settings` builds it).

The trainer section, plus the few shared settings the learner needs: the workers' sampling (the
behaviour transform its log-probs are scored under), the model's compute dtype, the run's seed and
epochs (the lr schedule's horizon), and the identity of the prompt stream that checkpoints record
(a callable: it loads the task, when the learner is built).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prl_actors.engines.config import SamplingSection
    from prl_actors.trainer.config import TrainerSection


@dataclass(frozen=True)
class LearnerSettings:
    trainer: TrainerSection
    sampling: SamplingSection  # worker.sampling
    dtype: str  # model.dtype
    seed: int  # run.seed
    epochs: int  # run.epochs
    data_identity: Callable[[], dict[str, Any]]  # the task's, as recorded with each checkpoint

    def with_trainer(self, **update: Any) -> LearnerSettings:
        """These settings with some trainer fields changed (a rank's device, tests' variants)."""
        return replace(self, trainer=self.trainer.model_copy(update=update))
