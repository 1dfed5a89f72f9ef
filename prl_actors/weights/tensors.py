"""Named tensors <-> raw bytes with dtype and shape (the weight-transfer payload).

Tensors travel as their raw little-endian bytes; `TensorMeta` carries name, dtype (torch spelling,
e.g. "float32", "bfloat16"), shape and byte count. numpy arrays and torch tensors are both accepted;
bfloat16 needs torch on the receiving side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from prl_actors.protocol.messages import TensorMeta


def _is_torch(t: Any) -> bool:
    return type(t).__module__.startswith("torch")


def tensor_bytes(t: Any) -> tuple[str, list[int], memoryview]:
    """(dtype name, shape, raw bytes view) of a numpy array or CPU/GPU torch tensor."""
    if _is_torch(t):
        import torch

        t = t.detach().to("cpu").contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        raw = t.view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)
        return dtype, list(t.shape), raw.reshape(-1).data
    a = np.ascontiguousarray(t)
    return a.dtype.name, list(a.shape), a.reshape(-1).view(np.uint8).data


def pack(tensors: Mapping[str, Any]) -> tuple[list[TensorMeta], list[memoryview]]:
    metas, views = [], []
    for name, t in tensors.items():
        dtype, shape, view = tensor_bytes(t)
        metas.append(TensorMeta(name=name, dtype=dtype, shape=shape, nbytes=view.nbytes))
        views.append(view)
    return metas, views


def unpack(metas: list[TensorMeta], buffer: bytes | bytearray | memoryview, as_torch: bool = False) -> dict:
    """Named tensors viewing `buffer` (no copy if it is writable). numpy unless `as_torch` (or bfloat16)."""
    out: dict[str, Any] = {}
    offset = 0
    mv = memoryview(buffer)
    for m in metas:
        chunk = mv[offset : offset + m.nbytes]
        offset += m.nbytes
        if as_torch or m.dtype == "bfloat16":
            import torch

            dtype = getattr(torch, m.dtype)
            raw = bytearray(chunk) if chunk.readonly else chunk  # view a writable buffer, copy only read-only
            t = torch.frombuffer(raw, dtype=torch.uint8) if m.nbytes else torch.zeros(0)
            out[m.name] = t.view(dtype).reshape(m.shape) if m.nbytes else torch.zeros(m.shape, dtype=dtype)
        else:
            out[m.name] = np.frombuffer(chunk, dtype=np.dtype(m.dtype)).reshape(m.shape)
    if offset != len(mv):
        raise ValueError(f"weight buffer holds {len(mv)} bytes, metadata describes {offset}")
    return out
