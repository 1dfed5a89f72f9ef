"""LoRA adapters on the wire and in the torch engine (no peft needed on this side).

What travels (trainer -> publisher -> workers) with `trainer.lora` set is the adapter only:

    base_model.model.<module>.lora_A.weight   [r, in_features]    (peft's own names, so the same
    base_model.model.<module>.lora_B.weight   [out_features, r]    tensors make a vLLM adapter dir)
    prl_lora.meta                             uint8 [n]: JSON {"format", "r", "alpha", "base", "targets"}

`base` is the fingerprint of the base checkpoint the adapter was trained on (`base_fingerprint`): an
adapter only means something on top of the very weights it was trained with, so an engine whose own
`model.path` holds other weights refuses it (`IncompatibleWeights`) instead of generating garbage.

The torch engine applies an adapter unmerged, as the trainer computes it: a forward hook on each
adapted linear layer adds (alpha / r) * B @ (A @ x) to its output. The base weights stay untouched,
so a new version only swaps the small A and B tensors (no copy of the base is kept, no rounding
drift from merging and unmerging), and the hooks fire whatever generation loop calls the model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prl_actors.model.errors import IncompatibleWeights

META = "prl_lora.meta"
PREFIX = "base_model.model."
FORMAT = 1
_SAMPLE = 1 << 20  # bytes of each weight file's start and end that go into the fingerprint
_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")


def base_fingerprint(model_dir: Path | str) -> str:
    """sha256 (16 hex digits) of a checkpoint's config.json and, per weight file, its name, size and
    first and last MiB (safetensors: the header with every tensor's name, dtype and offsets, and
    data). Cheap for any size, equal for copies of one checkpoint, different for other weights."""
    root = Path(model_dir)
    h = hashlib.sha256((root / "config.json").read_bytes())
    files = sorted({f for pattern in _WEIGHT_FILES for f in root.glob(pattern) if f.is_file()})
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with f.open("rb") as fh:
            h.update(fh.read(_SAMPLE))
            fh.seek(max(0, size - _SAMPLE))
            h.update(fh.read(_SAMPLE))
    return h.hexdigest()[:16]


def meta_tensor(r: int, alpha: float, base: str, targets: list[str]) -> torch.Tensor:
    """The adapter's description as a uint8 tensor (it travels as one more named tensor)."""
    blob = json.dumps({"format": FORMAT, "r": r, "alpha": alpha, "base": base, "targets": targets}).encode()
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


def is_adapter(tensors: Mapping[str, Any]) -> bool:
    return META in tensors


@dataclass
class Adapter:
    """A parsed adapter: per adapted module (name in the base model), its A [r, in] and B [out, r]."""

    version: int
    r: int
    alpha: float
    base: str
    targets: list[str]
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @property
    def scale(self) -> float:
        return self.alpha / self.r


def parse(version: int, tensors: Mapping[str, Any]) -> Adapter:
    """Adapter tensors (numpy or torch) -> Adapter; a malformed set raises IncompatibleWeights."""
    meta = _meta(tensors[META])
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        if name == META:
            continue
        module, kind = _split(name)
        pairs.setdefault(module, {})[kind] = _torch(t)
    modules = {}
    for module, ab in pairs.items():
        if set(ab) != {"lora_A", "lora_B"}:
            raise IncompatibleWeights(f"adapter of version {version}: {module} lacks lora_A or lora_B")
        modules[module] = (ab["lora_A"], ab["lora_B"])
    if not modules:
        raise IncompatibleWeights(f"adapter of version {version} holds no lora_A / lora_B tensors")
    return Adapter(version, int(meta["r"]), float(meta["alpha"]), str(meta["base"]), list(meta["targets"]), modules)


def _meta(t: Any) -> dict[str, Any]:
    try:
        meta = json.loads(bytes(np.asarray(t, dtype=np.uint8)).decode())
    except (ValueError, UnicodeDecodeError):
        raise IncompatibleWeights(f"{META} is not an adapter description") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise IncompatibleWeights(f"{META}: unknown adapter format (expected format {FORMAT})")
    return meta


def _split(name: str) -> tuple[str, str]:
    """'base_model.model.model.layers.0.mlp.up_proj.lora_A.weight' -> ('model.layers.0.mlp.up_proj', 'lora_A')."""
    parts = name.removeprefix(PREFIX).split(".")
    if not name.startswith(PREFIX) or len(parts) < 3 or parts[-1] != "weight" or parts[-2] not in ("lora_A", "lora_B"):
        raise IncompatibleWeights(f"{name!r} is not a LoRA adapter tensor (base_model.model.<module>.lora_A.weight)")
    return ".".join(parts[:-2]), parts[-2]


def _torch(t: Any) -> torch.Tensor:
    if isinstance(t, torch.Tensor):
        return t
    a = np.asarray(t)
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def linear_shape(module: torch.nn.Module) -> tuple[int, int] | None:
    """(in_features, out_features) of a linear layer (torch Linear, or GPT-2's transposed Conv1D)."""
    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor):
        fan_in, fan_out = weight.shape  # Conv1D stores [in, out]
        return int(fan_in), int(fan_out)
    return None


class AdapterHooks:
    """Applies adapters to a model in place of merging them: one forward hook per adapted layer.

    `load` validates everything first (base fingerprint, module names, kinds and shapes) and only
    then swaps the hooks, so a refused adapter leaves the previous version working."""

    def __init__(self, model: torch.nn.Module, model_dir: Path | str) -> None:
        self.model, self.model_dir = model, Path(model_dir)
        self._fingerprint: str | None = None
        self._handles: list[Any] = []
        self.adapter: Adapter | None = None

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = base_fingerprint(self.model_dir)
        return self._fingerprint

    def load(self, version: int, tensors: Mapping[str, Any]) -> None:
        adapter = parse(version, tensors)
        if adapter.base != self.fingerprint:
            raise IncompatibleWeights(
                f"the adapter of version {version} was trained on another base model (fingerprint "
                f"{adapter.base}) than this worker's model ({self.model_dir}, fingerprint {self.fingerprint}): "
                "every worker needs the trainer's model.path (the same checkpoint files)"
            )
        param = next(self.model.parameters())
        placed = {name: self._placed(adapter, name, param) for name in adapter.modules}
        self.clear()
        for name, (a, b) in placed.items():
            hook = _hook(a, b, adapter.scale)
            self._handles.append(self.model.get_submodule(name).register_forward_hook(hook))
        self.adapter = adapter

    def _placed(self, adapter: Adapter, name: str, param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A and B of module `name`, checked against the model and moved to its device and dtype."""
        try:
            module = self.model.get_submodule(name)
        except AttributeError:
            raise IncompatibleWeights(f"adapter of version {adapter.version}: the model has no module {name}") from None
        shape = linear_shape(module)
        if shape is None:
            raise IncompatibleWeights(f"adapter of version {adapter.version}: {name} is not a linear layer")
        a, b = adapter.modules[name]
        (fan_in, fan_out), r = shape, adapter.r
        if tuple(a.shape) != (r, fan_in) or tuple(b.shape) != (fan_out, r):
            raise IncompatibleWeights(
                f"adapter of version {adapter.version}: {name} has A {tuple(a.shape)} and B {tuple(b.shape)}, "
                f"the model's layer wants A ({r}, {fan_in}) and B ({fan_out}, {r})"
            )
        return a.to(param.device, param.dtype), b.to(param.device, param.dtype)

    def clear(self) -> None:
        """Remove every hook: the model computes with its base weights alone again."""
        for handle in self._handles:
            handle.remove()
        self._handles, self.adapter = [], None


def _hook(a: torch.Tensor, b: torch.Tensor, scale: float) -> Any:
    """out + scale * B @ (A @ x): the layer's output plus the adapter's (x: [..., in], out: [..., out])."""

    def hook(module: torch.nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        x = args[0].to(a.dtype)
        delta = torch.nn.functional.linear(torch.nn.functional.linear(x, a), b)  # [..., out]
        return out + scale * delta.to(out.dtype)

    return hook
