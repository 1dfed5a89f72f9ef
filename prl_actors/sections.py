"""What every config section is built on, and the one error a bad config raises: a leaf.

Each section lives beside the code that reads it (`coordinator/config.py`, `worker/config.py`, ...);
`prl_actors/config.py` composes them into the run's one `Config` and holds the rules that span
sections. A component imports its own section from here up, never the root model at run time, so
the import graph stays layered (tools/import_cycles.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class ConfigError(Exception):
    """A bad config file or override; the message is meant for the user as is."""


class Section(BaseModel):
    """A config section: unknown keys are refused, and an assignment is validated like a load."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


Threads = Annotated[int, Field(ge=1)] | Literal["auto"]
"""A torch thread count: a number, or auto (runtime/threads.py decides)."""


GREEDY_REFUSED = (  # the config check (config.py) and the learner (training/grpo.py) both refuse greedy GRPO
    "worker.sampling.temperature 0 (greedy) cannot be trained with GRPO: every sample of a group would "
    "be the same, so every advantage is 0 and nothing is learned; use a temperature > 0 (e.g. 1.0)"
)
