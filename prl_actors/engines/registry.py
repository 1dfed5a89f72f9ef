"""Engine selection by `worker.engine`; heavy backends are imported only when chosen."""

from __future__ import annotations

from pathlib import Path

from prl_actors.config import Config, ConfigError
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

        return TorchEngine(cfg, model_dir)
    if kind == "vllm":
        from prl_actors.engines.vllm_engine import VllmEngine

        return VllmEngine(cfg, model_dir)
    raise ConfigError(f"unknown worker.engine {kind!r}: use torch, vllm or sim")


def check_engine(cfg: Config, model_dir: Path | None, workers: int = 1) -> None:
    """Refuse, with one ConfigError line, an engine setup that would only fail inside the start-up
    of `workers` workers on this host (`up` calls it before it starts any): vLLM missing, on another
    device kind, unable to run the model's attention on CPU, or short of RAM on CPU."""
    if cfg.worker.engine == "vllm" and model_dir is not None:
        from prl_actors.engines.vllm_engine import check_vllm_setup

        check_vllm_setup(cfg, model_dir, workers)
