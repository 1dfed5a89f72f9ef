"""Engine selection by `worker.engine`; heavy backends are imported only when chosen."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prl_actors.sections import ConfigError

if TYPE_CHECKING:
    from prl_actors.config import Config
    from prl_actors.engines.base import Engine


def make_engine(cfg: Config, model_dir: Path | None) -> Engine:
    """torch / vllm need the model directory (see prepare_model); sim needs none."""
    kind = cfg.worker.engine
    if kind == "sim":
        from prl_actors.engines.sim import SimEngine

        return SimEngine(cfg)
    if model_dir is None:
        raise ConfigError(f"worker.engine {kind!r} needs a model directory (prepare_model)")
    if kind == "torch":
        from prl_actors.engines.torch_engine import TorchEngine

        engine: Engine = TorchEngine(cfg, model_dir)
    elif kind == "vllm":
        from prl_actors.engines.vllm_engine import VllmEngine

        engine = VllmEngine(cfg, model_dir)
    else:
        raise ConfigError(f"unknown worker.engine {kind!r}: use torch, vllm or sim")
    return multi_turn_engine(cfg, engine) if cfg.task.multi_turn else engine


def multi_turn_engine(cfg: Config, engine: Engine) -> Engine:
    """`engine` playing the run's episodes (engines/multiturn.py): its turns, the task's environment."""
    from prl_actors.engines.multiturn import MultiTurnEngine, TurnBackend
    from prl_actors.envs_llm.registry import env_factory, tool_schemas
    from prl_actors.envs_llm.render import Renderer
    from prl_actors.tasks.registry import load_task

    turn_tokens = cfg.task.max_turn_tokens or cfg.worker.sampling.max_new_tokens
    turns: TurnBackend
    if cfg.worker.engine == "torch":
        from prl_actors.engines.torch_engine import TorchEngine, TorchTurns

        assert isinstance(engine, TorchEngine)
        turns = TorchTurns(engine, turn_tokens)
    else:
        from prl_actors.engines.vllm_turns import VllmTurns

        turns = VllmTurns(engine, turn_tokens)
    renderer = Renderer(engine.tokenizer, cfg.task.chat_template, tool_schemas(cfg.task))  # type: ignore[attr-defined]
    max_model_len = cfg.worker.max_model_len if cfg.worker.engine == "vllm" else None
    task = load_task(
        cfg.task,
        cfg.run.seed,
        model_path=cfg.model.path,
        max_new_tokens=cfg.worker.sampling.max_new_tokens,
        max_model_len=max_model_len,
    )
    factory = env_factory(cfg.task, task.reward)
    return MultiTurnEngine(  # type: ignore[return-value]
        turns,
        factory,
        renderer,
        max_turns=cfg.task.max_turns,
        max_turn_tokens=turn_tokens,
        env_threads=cfg.task.env_threads,
    )


def check_engine(cfg: Config, model_dir: Path | None, workers: int = 1) -> None:
    """Refuse, with one ConfigError line, an engine setup that would only fail inside the start-up
    of `workers` workers on this host (`up` calls it before it starts any): vLLM missing, on another
    device kind, unable to run the model's attention on CPU, or short of RAM on CPU."""
    if cfg.task.multi_turn and cfg.worker.engine == "sim":
        raise ConfigError("multi-turn tasks (task.environment, task.tools, guess) need worker.engine torch or vllm")
    if cfg.worker.engine == "vllm" and model_dir is not None:
        from prl_actors.engines.vllm_engine import check_vllm_setup

        check_vllm_setup(cfg, model_dir, workers)
