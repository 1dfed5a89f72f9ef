"""What an engine reads of the run's config (launch/build.py's `engine_settings` builds it).

The worker section (device, batch rows, group size, sampling, the vLLM options), plus the few
shared settings the engines need: the model's compute dtype, whether prompts take the chat
template, the run's seed (per-group sampling seeds), the trainer's LoRA settings (vLLM starts with
LoRA enabled) and the `sim:` section (the simulated engine).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prl_actors.engines.config import SimSection

if TYPE_CHECKING:
    from prl_actors.trainer.config import LoraSection
    from prl_actors.worker.config import WorkerSection


@dataclass(frozen=True)
class EngineSettings:
    worker: WorkerSection
    dtype: str  # model.dtype
    chat_template: bool  # task.chat_template
    seed: int  # run.seed
    lora: LoraSection | None = None  # trainer.lora
    sim: SimSection = field(default_factory=SimSection)
