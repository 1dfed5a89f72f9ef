"""Count what a piece of torch code dispatches: aten ops (each a kernel launch on a GPU) and host syncs.

On an accelerator each dispatched aten op costs ~5-10 us of host time (a kernel launch) and each host
sync (`aten::_local_scalar_dense`: `.item()`, `float(t)`, `int(t)`, a Python `if` on a tensor;
`aten::nonzero` and friends: an output shape that depends on the values; a copy to the host:
`.cpu()`, `.tolist()` on a device tensor) waits for every queued kernel. Both can be counted on CPU,
where the same code dispatches the same ops, so the counts are a device-free proxy of how a loop
will run on a GPU. The trainer's proxies (issue 37: accumulate + flush) and the engine's (issue 38:
ops and syncs per decode step) both use this one counter.

    with DispatchCount() as count:
        learner.accumulate(group); learner.flush()
    count.ops, count.syncs, count.top(10)

`.tolist()` / `.numpy()` on a CPU tensor read its memory without dispatching anything, so a
`TorchFunctionMode` beside the dispatch mode counts those calls as syncs too (on a GPU they copy
to the host). Ops run by autograd's backward are dispatched in this thread and counted as well.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
SYNC_OPS = frozenset(
    {
        "_local_scalar_dense",  # .item(), float(t), int(t), bool(t), `if t:`
        "item",
        "is_nonzero",
        "equal",
        "nonzero",  # t[bool_mask], torch.where(mask) with one argument: a data-dependent shape
        "nonzero_static",
        "argwhere",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "bincount",
    }
)
"""aten operations (overload packets) whose result the host must wait for: a scalar read or an
output shape that depends on the values. `repeat_interleave` counts too unless given output_size."""
HOST_READS = frozenset({"tolist", "numpy", "__array__"})
"""Tensor methods that read values on the host (counted at the Python level: on CPU they dispatch
no op; `item` is counted once, by its _local_scalar_dense)."""


class _HostReads(TorchFunctionMode):
    def __init__(self, owner: DispatchCount) -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.owner.syncs += 1
            self.owner.by_sync[name] += 1
        return func(*args, **(kwargs or {}))


class DispatchCount(TorchDispatchMode):
    """Counts dispatched aten ops (`ops`, `by_op`) and host syncs (`syncs`, `by_sync`) while active.
    A device-to-host copy (`_to_copy`/`copy_` from a non-CPU tensor to the CPU) counts as a sync."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.syncs = 0
        self.by_op: Counter[str] = Counter()
        self.by_sync: Counter[str] = Counter()
        self._reads = _HostReads(self)

    def __enter__(self) -> DispatchCount:
        self._reads.__enter__()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._reads.__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = str(func.overloadpacket.__name__)
        self.ops += 1
        self.by_op[name] += 1
        if _syncs(name, func, args, kwargs):
            self.syncs += 1
            self.by_sync[name] += 1
        return func(*args, **kwargs)

    def top(self, n: int = 10) -> list[tuple[str, int]]:
        """The n most dispatched ops (what to look at when a count grows)."""
        return self.by_op.most_common(n)


def _syncs(name: str, func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    """Does this op make the host wait for the device (see SYNC_OPS)?"""
    if name in SYNC_OPS or (name == "repeat_interleave" and "output_size" not in kwargs):
        return True
    return _to_host(func, args, kwargs) or _mask_index(func, args)


def _mask_index(func: Any, args: Any) -> bool:
    """t[mask] / t[mask] = v with a bool mask: the result's size is the mask's count (on CPU the
    kernel finds it without dispatching nonzero; a GPU syncs for it)."""
    if func not in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


def _to_host(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    """A copy from an accelerator tensor into host memory (the host waits for it)."""
    if func is aten._to_copy.default:
        src, dst = args[0], kwargs.get("device")
        on_device = isinstance(src, torch.Tensor) and src.device.type != "cpu"
        return on_device and dst is not None and torch.device(dst).type == "cpu"
    if func is aten.copy_.default:
        dst, src = args[0], args[1]
        return src.device.type != "cpu" and dst.device.type == "cpu"
    return False
