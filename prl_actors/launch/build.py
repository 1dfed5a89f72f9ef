"""From the run's Config to the parts the libraries build: the one place that unpacks the root config for them.

The libraries (tasks/, model/, envs_llm/, engines/, buffer/) take their own sections and plain
values; launch/, cli/, the benchmarks and the tests hold a whole `Config` and come here. Imports are
lazy: `up` reaches the task and the model directory without importing torch unless a model must be built.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prl_actors.buffer.group_check import GroupChecker
    from prl_actors.config import Config
    from prl_actors.engines.base import Engine
    from prl_actors.engines.settings import EngineSettings
    from prl_actors.protocol.messages import Prompt
    from prl_actors.tasks.base import Task


def task(cfg: Config) -> Task:
    """The run's task (tasks/registry.load_task); on `run.resume` (not the sim engine), refused when
    its data are not those of the checkpoint to resume from (data/position.py)."""
    from prl_actors.tasks.registry import check_resume

    loaded = _load_task(cfg)
    if cfg.run.resume and cfg.worker.engine != "sim":
        check_resume(loaded, cfg.run.run_dir, cfg.coordinator.groups_per_epoch, stride(cfg))
    return loaded


def _load_task(cfg: Config) -> Task:
    """tasks/registry.load_task with the run's settings (no resume check: `task` adds it)."""
    from prl_actors.tasks.registry import load_task

    w = cfg.worker
    return load_task(
        cfg.task,
        cfg.run.seed,
        model_path=cfg.model.path,
        max_new_tokens=w.sampling.max_new_tokens,
        max_model_len=w.max_model_len if w.engine == "vllm" else None,
        sim_arms=cfg.sim.arms if w.engine == "sim" else None,
    )


def stride(cfg: Config) -> int:
    """Stream positions per epoch (data/position.py): B, or B x max_sampling_rounds (dynamic sampling)."""
    from prl_actors.training.dynamic_sampling import epoch_stride

    c = cfg.coordinator
    return epoch_stride(c.groups_per_epoch, c.dynamic_sampling, c.max_sampling_rounds)


def data_identity(cfg: Config) -> dict[str, Any]:
    """The identity of the run's prompt stream, as recorded in checkpoints (data/position.py)."""
    return task(cfg).data_identity(cfg.coordinator.groups_per_epoch, stride(cfg))


def model_dir(
    cfg: Config, run_dir: str | Path | None = None, on_step: Callable[[int, int], None] | None = None
) -> Path:
    """model/builtin.prepare_model for the run: `model.path` validated, or the built-in model in
    RUN_DIR/model (`run_dir`, default run.run_dir), built when it must be (torch)."""
    from prl_actors.model.builtin import prepare_model

    return prepare_model(cfg.model, cfg.task, cfg.run.seed, Path(run_dir or cfg.run.run_dir), on_step=on_step)


def ready_model_dir(cfg: Config, run_dir: str | Path | None = None) -> Path | None:
    """model/dirs.ready_model_dir for the run (without torch): None when the built-in model must be built."""
    from prl_actors.model.dirs import ready_model_dir as ready

    return ready(cfg.model, cfg.task, cfg.run.seed, Path(run_dir or cfg.run.run_dir))


def model_key(cfg: Config) -> str:
    """The built-in model's cache key for the run (model/dirs.builtin_key)."""
    from prl_actors.model.dirs import builtin_key

    return builtin_key(cfg.model, cfg.task, cfg.run.seed)


def engine_settings(cfg: Config) -> EngineSettings:
    """What the engines read of the run's config (engines/settings.py)."""
    from prl_actors.engines.settings import EngineSettings

    return EngineSettings(
        worker=cfg.worker,
        dtype=cfg.model.dtype,
        chat_template=cfg.task.chat_template,
        seed=cfg.run.seed,
        lora=cfg.trainer.lora,
        sim=cfg.sim,
    )


def engine(cfg: Config, model_dir: Path | None) -> Engine:
    """The run's engine (engines/registry.make_engine: torch / vllm need the model directory, sim
    none), playing the task's episodes for a multi-turn task (engines/registry.multi_turn_engine)."""
    from prl_actors.engines.registry import make_engine, multi_turn_engine

    settings = engine_settings(cfg)
    made = make_engine(settings, model_dir)
    if not cfg.task.multi_turn or cfg.worker.engine == "sim":
        return made

    loaded = _load_task(cfg)
    return multi_turn_engine(made, settings, cfg.task, loaded.reward)


def check_engine(cfg: Config, model_dir: Path | None, workers: int = 1) -> None:
    """Refuse, with one ConfigError line, an engine setup that would only fail inside the start-up
    of `workers` workers on this host (`up` calls it before it starts any): vLLM missing, on another
    device kind, unable to run the model's attention on CPU, or short of RAM on CPU."""
    from prl_actors.sections import ConfigError

    if cfg.task.multi_turn and cfg.worker.engine == "sim":
        raise ConfigError("multi-turn tasks (task.environment, task.tools, guess) need worker.engine torch or vllm")
    if cfg.worker.engine == "vllm" and model_dir is not None:
        from prl_actors.engines.vllm_engine import check_vllm_setup

        check_vllm_setup(cfg.worker, model_dir, workers)


def checker_model_dir(cfg: Config) -> Path | None:
    """Where `up` prepared the run's model (never built here: that is `up`'s job), if it is on this host."""
    path = Path(cfg.model.path) if cfg.model.path else Path(cfg.run.run_dir) / "model"
    return path if (path / "config.json").is_file() else None


def group_checker(cfg: Config, model_dir: Path | None) -> GroupChecker:
    """The buffer's GroupChecker for the run (buffer/group_check_setup.py): what its engine produces,
    so honest groups pass; the model's checks only with `model_dir` (see `checker_model_dir`)."""
    from prl_actors.buffer.group_check import GroupChecker
    from prl_actors.buffer.group_check_setup import epoch_prompts, simulated, with_model

    w = cfg.worker
    loaded = _load_task(cfg)
    checker = GroupChecker(
        prompt_of=epoch_prompts(loaded, cfg.coordinator),
        score=loaded.score if cfg.buffer.verify_rewards else None,
        length_penalty=loaded.length_penalty,
        reward_tolerance=cfg.buffer.reward_tolerance,
    )
    if w.engine == "sim":
        return simulated(checker, cfg.sim)
    checker.max_response_tokens = w.sampling.max_new_tokens
    if cfg.task.multi_turn:  # every model turn bounded, max_turns of them
        checker.max_response_tokens = cfg.task.max_turns * (cfg.task.max_turn_tokens or w.sampling.max_new_tokens)
    if model_dir is not None:
        episode = _episode_prompt_ids(cfg, loaded.reward) if cfg.task.multi_turn else None
        with_model(
            checker,
            model_dir,
            templated=cfg.task.chat_template,
            stop=list(w.sampling.stop),
            decode=w.engine == "torch",
            episode_prompt_ids=episode,
        )
    return checker


def _episode_prompt_ids(
    cfg: Config, reward: Callable[[str, str, str], float]
) -> Callable[[Any], Callable[[Prompt], list[int]]]:
    """tokenizer -> (row -> the prompt ids of a multi-turn group, as its engine renders them:
    the environment's reset with the task's `reward`, envs_llm/registry.episode_prompt_ids)."""

    def make(tokenizer: Any) -> Callable[[Prompt], list[int]]:
        from prl_actors.envs_llm.registry import episode_prompt_ids

        return episode_prompt_ids(cfg.task, tokenizer, reward)

    return make
