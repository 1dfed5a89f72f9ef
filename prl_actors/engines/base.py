"""The generation-engine interface every InferenceWorker backend implements.

An engine holds exactly one weight version at a time and generates with only that version, so every
sample it returns is tagged by the worker with `engine.version` (the on-policy invariant).

Two ways to drive it:
- streaming (what the worker does): `admit` groups, call `step` repeatedly; each call returns the
  groups finished at that step (continuous batching: new groups enter the running batch as rows
  free up). `load_weights` is refused while the engine is `busy`; `abort` empties it.
- one call: `generate(prompts, G)` admits everything and steps until idle (tests, benchmarks, the
  single-process loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from prl_actors.model.errors import IncompatibleWeights as IncompatibleWeights  # re-exported: engines raise it

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Prompt


@dataclass
class Generated:
    """One response: token ids (response only), per-token behaviour log-probs (see
    training/behaviour.py), and whether it stopped on eos (False: it hit max_new_tokens)."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finished: bool = True
    reward: float | None = None  # a multi-turn episode's own reward (None: the task scores `text`)
    loss_mask: list[int] | None = None  # multi-turn: 1 = model token, 0 = environment token (Sample.loss_mask)


@dataclass
class GeneratedGroup:
    group_id: int
    prompt: str
    prompt_ids: list[int]
    samples: list[Generated] = field(default_factory=list)
    gen_s: float = 0.0  # from admission to its last sample


class Engine(Protocol):
    version: int
    """The weight version currently loaded (-1 before the first load)."""

    max_rows: int
    """Rows (samples) the running batch holds at most."""

    def load_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        """Swap in new weights (named tensors, numpy or torch) without a restart; never while busy."""
        ...

    def admit(self, prompts: list[Prompt], group_size: int) -> None:
        """Queue groups of `group_size` samples; they enter the running batch as rows free up."""
        ...

    def step(self) -> list[GeneratedGroup]:
        """Advance the running batch; returns the groups whose last sample finished now."""
        ...

    def abort(self) -> list[int]:
        """Drop every queued and running group; returns their ids."""
        ...

    @property
    def busy(self) -> bool:
        """Some group is queued or running."""
        ...

    @property
    def rows(self) -> int:
        """Rows queued or running."""
        ...

    def generate(self, prompts: list[Prompt], group_size: int) -> list[GeneratedGroup]:
        """G samples for each prompt, in prompt order (admit, then step until idle)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class NotingEngine(Protocol):
    """An engine that learns facts about how it runs (the torch engine: which decode attention a
    model got, and why) and hands each over once, as an event name and its fields."""

    def drain_notes(self) -> list[tuple[str, dict[str, Any]]]: ...


@runtime_checkable
class ContextLimited(Protocol):
    """An engine that knows the longest context its model takes (None: no limit known)."""

    max_context: int | None


class EngineBusy(RuntimeError):
    """Weights cannot change while groups are generating (one version per batch)."""


def engine_notes(engine: Engine) -> list[tuple[str, dict[str, Any]]]:
    """Facts an engine learned about how it runs (an event name and its fields, each said once), for
    the worker to log: an engine may offer `drain_notes()` (the torch engine: which decode attention
    a model got, and why); others have none."""
    return list(engine.drain_notes()) if isinstance(engine, NotingEngine) else []


def generate_all(engine: Engine, prompts: list[Prompt], group_size: int) -> list[GeneratedGroup]:
    """`Engine.generate` for any engine with admit/step: every group, in prompt order."""
    if engine.busy:
        raise EngineBusy("generate needs an idle engine")
    engine.admit(prompts, group_size)
    done: dict[int, GeneratedGroup] = {}
    while engine.busy:
        done.update((g.group_id, g) for g in engine.step())
    return [done[p.group_id] for p in prompts]


class OneCallStreaming:
    """admit/step/abort for an engine that generates a whole list of prompts in one call and batches
    internally (vLLM): `step` generates everything queued and returns it all (groups stream per step,
    not per finished group). A subclass provides `generate_now(prompts, G)` and calls `__init__`."""

    max_rows: int = 1 << 30

    def __init__(self) -> None:
        self._queued: list[tuple[Prompt, int]] = []

    def generate_now(self, prompts: list[Prompt], group_size: int) -> list[GeneratedGroup]:
        raise NotImplementedError

    def admit(self, prompts: list[Prompt], group_size: int) -> None:
        self._queued += [(p, group_size) for p in prompts]

    def step(self) -> list[GeneratedGroup]:
        queued, self._queued = self._queued, []
        out: list[GeneratedGroup] = []
        for size in sorted({g for _, g in queued}):
            out += self.generate_now([p for p, g in queued if g == size], size)
        return out

    def abort(self) -> list[int]:
        dropped, self._queued = [p.group_id for p, _ in self._queued], []
        return dropped

    @property
    def busy(self) -> bool:
        return bool(self._queued)

    @property
    def rows(self) -> int:
        return sum(g for _, g in self._queued)

    def generate(self, prompts: list[Prompt], group_size: int) -> list[GeneratedGroup]:
        return generate_all(self, prompts, group_size)  # type: ignore[arg-type]
