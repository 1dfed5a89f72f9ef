"""Counting what a decode step asks of the device, on any device (CPU included).

On a GPU each dispatched aten operation is about one kernel launch, and each read of a device value
by the host (`.item()`, `.tolist()`, a data-dependent shape such as `nonzero`) is a host sync: the
host waits for the device to drain. A decode step that launches hundreds of kernels and syncs every
step is launch- and host-bound however fast the device is (issue 38: ~40 ms per step on an H200 for
a ~0.2 ms weight read). `OpCounter` counts both around any code, on CPU too, so tests can hold the
count flat in the batch size and the benchmark can report it:

    with OpCounter() as c:
        batch.step()
    c.ops, c.syncs

`ops` counts every dispatched aten operation (views included: a strict count). `syncs` counts the
operations that need a device value on the host (`SYNC_OPS`, e.g. `aten::_local_scalar_dense`), a
copy from a device to the CPU, and host reads that bypass the dispatcher on CPU tensors
(`Tensor.tolist`, `Tensor.numpy`, `Tensor.__array__`, patched while the counter is open).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = frozenset(
    {
        "_local_scalar_dense",
        "item",
        "is_nonzero",
        "equal",
        "nonzero",
        "nonzero_static",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "bincount",
        "argwhere",
    }
)
"""aten operations (overload packets) whose result the host must wait for: a scalar read or a
data-dependent output shape."""
HOST_READS = ("tolist", "numpy", "__array__")
"""Tensor methods that hand device data to Python without going through the dispatcher on CPU."""
_PATCH_LOCK = threading.Lock()


class OpCounter(TorchDispatchMode):
    """Counts dispatched aten operations and host syncs while open (see module docstring).
    Not re-entrant; one counter per thread at a time (the host-read patch is process-wide)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: Counter[str] = Counter()
        self.sync_names: Counter[str] = Counter()
        self._saved: dict[str, Callable[..., Any]] = {}

    @property
    def ops(self) -> int:
        return sum(self.by_name.values())

    @property
    def syncs(self) -> int:
        return sum(self.sync_names.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        self.by_name[name] += 1
        if name in SYNC_OPS or name == "repeat_interleave" and "output_size" not in (kwargs or {}):
            self.sync_names[name] += 1
        elif name == "_to_copy" and _to_host(args, kwargs or {}):
            self.sync_names["device_to_host"] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> OpCounter:
        _PATCH_LOCK.acquire()
        for method in HOST_READS:
            original = getattr(torch.Tensor, method)
            self._saved[method] = original
            setattr(torch.Tensor, method, self._reading(method, original))
        return super().__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for method, original in self._saved.items():
                setattr(torch.Tensor, method, original)
            self._saved.clear()
            _PATCH_LOCK.release()

    def _reading(self, method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.sync_names[method] += 1
            return original(tensor, *args, **kwargs)

        return read


def _to_host(args: Any, kwargs: dict[str, Any]) -> bool:
    """Is this `_to_copy` a copy from an accelerator to the CPU?"""
    source = args[0] if args else None
    target = kwargs.get("device")
    return (
        isinstance(source, torch.Tensor)
        and source.device.type != "cpu"
        and target is not None
        and (torch.device(target).type == "cpu")
    )
