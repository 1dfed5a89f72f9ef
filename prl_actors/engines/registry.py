"""Engine selection by `worker.engine`; heavy backends are imported only when chosen.

launch/build.py's `engine` composes them for a run: the engine `make_engine` chooses, wrapped by
`multi_turn_engine` for a multi-turn task."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from prl_actors.sections import ConfigError

if TYPE_CHECKING:
    from prl_actors.engines.base import Engine
    from prl_actors.engines.settings import EngineSettings
    from prl_actors.tasks.config import TaskSection


def make_engine(settings: EngineSettings, model_dir: Path | None) -> Engine:
    """The engine of `settings.worker.engine`: torch / vllm need the model directory (see
    prepare_model); sim needs none."""
    kind = settings.worker.engine
    if kind == "sim":
        from prl_actors.engines.sim import SimEngine

        return SimEngine(settings)
    if model_dir is None:
        raise ConfigError(f"worker.engine {kind!r} needs a model directory (prepare_model)")
    if kind == "torch":
        from prl_actors.engines.torch_engine import TorchEngine

        return TorchEngine(settings, model_dir)
    if kind == "vllm":
        from prl_actors.engines.vllm_engine import VllmEngine

        return VllmEngine(settings, model_dir)
    raise ConfigError(f"unknown worker.engine {kind!r}: use torch, vllm or sim")


def multi_turn_engine(
    engine: Engine, settings: EngineSettings, task: TaskSection, reward: Callable[[str, str, str], float]
) -> Engine:
    """`engine` playing the task's episodes (engines/multiturn.py): its turns, the task's
    environment (`reward`: the loaded task's, for tools)."""
    from prl_actors.engines.multiturn import MultiTurnEngine, TurnBackend
    from prl_actors.envs_llm.registry import env_factory, tool_schemas
    from prl_actors.envs_llm.render import Renderer

    turn_tokens = task.max_turn_tokens or settings.worker.sampling.max_new_tokens
    turns: TurnBackend
    if settings.worker.engine == "torch":
        from prl_actors.engines.torch_engine import TorchEngine, TorchTurns

        assert isinstance(engine, TorchEngine)
        turns = TorchTurns(engine, turn_tokens)
    else:
        from prl_actors.engines.vllm_turns import VllmTurns

        turns = VllmTurns(engine, turn_tokens)
    renderer = Renderer(engine.tokenizer, task.chat_template, tool_schemas(task))  # type: ignore[attr-defined]
    return MultiTurnEngine(  # type: ignore[return-value]
        turns,
        env_factory(task, reward),
        renderer,
        max_turns=task.max_turns,
        max_turn_tokens=turn_tokens,
        env_threads=task.env_threads,
    )
