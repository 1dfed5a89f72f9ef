"""Device names from the config -> torch devices, with a clear error when the backend is missing."""

from __future__ import annotations

import torch

from prl_actors.sections import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def resolve_device(name: str) -> torch.device:
    """ "cpu", "cuda"/"cuda:N" (must be available) or "npu"/"npu:N" (imports torch_npu lazily)."""
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} was asked for but torch sees no CUDA device")
        return torch.device(name)
    if name.startswith("npu"):
        try:
            import torch_npu  # noqa: F401  (registers the "npu" device with torch)
        except ImportError:
            raise ConfigError(f"device {name!r} needs the Ascend plugin: pip install torch-npu") from None
        return torch.device(name)
    raise ConfigError(f"unknown device {name!r}: use cpu, cuda, cuda:N, npu or npu:N")


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}: use one of {sorted(DTYPES)}")
    return DTYPES[name]
