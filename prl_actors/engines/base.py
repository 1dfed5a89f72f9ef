"""The generation-engine interface every InferenceWorker backend implements.

An engine holds exactly one weight version at a time. `generate` must use only that version, so
every sample it returns is tagged by the worker with `engine.version` (the on-policy invariant).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prl_actors.protocol.messages import Prompt


class IncompatibleWeights(ValueError):
    """Weights that cannot be this engine's next version (names, shapes, or a LoRA adapter trained on
    another base model): `load_weights` raises it before changing anything, and the worker stops with
    it as its one-line error (retrying the same fetch could never succeed)."""


@dataclass
class Generated:
    """One response: token ids (response only), per-token logprobs under the generating weights."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finished: bool = True


@dataclass
class GeneratedGroup:
    group_id: int
    prompt: str
    prompt_ids: list[int]
    samples: list[Generated] = field(default_factory=list)


class Engine(Protocol):
    version: int
    """The weight version currently loaded (-1 before the first load)."""

    def load_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        """Swap in new weights (named tensors, numpy or torch) without a restart."""
        ...

    def generate(self, prompts: list[Prompt], group_size: int) -> list[GeneratedGroup]:
        """G samples for each prompt, with the loaded weights."""
        ...

    def close(self) -> None: ...
