"""Typed arrays on the wire: one raw payload frame per array, described by a TensorMeta in the message.

    pack({"obs": a, "reward": r})  -> (metas, frames)   # frames are views, no copy for contiguous arrays
    unpack(metas, frames)          -> {"obs": a, ...}    # read-only views of the received frames

Invariants: frame i carries metas[i]; its bytes are the array C-contiguous and little-endian, exactly
`nbytes` = prod(shape) x itemsize; dtypes come from a fixed set. Anything else is an `ArrayError` with
a sentence saying what is wrong (the receiving core refuses the message and lives on).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from prl_actors.protocol.messages import TensorMeta

if TYPE_CHECKING:
    from prl_actors.protocol.codec import Frame

DTYPES = frozenset({"float32", "float64", "int64", "int32", "int8", "uint8", "bool"})
Array = npt.NDArray[Any]


class ArrayError(ValueError):
    """Arrays that do not match their description (or a message's required arrays)."""


def pack(arrays: Mapping[str, Array]) -> tuple[list[TensorMeta], list[Frame]]:
    """Metas and frames for `arrays`, in the mapping's order."""
    metas, frames = [], []
    for name, value in arrays.items():
        a = np.ascontiguousarray(value)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        if a.dtype.name not in DTYPES:
            raise ArrayError(f"array {name!r}: dtype {a.dtype.name} is not one of {sorted(DTYPES)}")
        metas.append(TensorMeta(name=name, dtype=a.dtype.name, shape=list(a.shape), nbytes=a.nbytes))
        frames.append(a.reshape(-1).view(np.uint8).data if a.nbytes else b"")
    return metas, frames


def unpack(metas: Sequence[TensorMeta], frames: Sequence[Frame], required: Iterable[str] = ()) -> dict[str, Array]:
    """name -> array (views of the frames); ArrayError when the frames do not match the metas."""
    if len(metas) != len(frames):
        raise ArrayError(f"{len(metas)} arrays described but {len(frames)} payload frames sent")
    out: dict[str, Array] = {}
    for meta, frame in zip(metas, frames, strict=True):
        out[meta.name] = _one(meta, frame)
    missing = sorted(set(required) - out.keys())
    if missing:
        raise ArrayError(f"missing arrays: {', '.join(missing)}")
    return out


def _one(meta: TensorMeta, frame: Frame) -> Array:
    if meta.dtype not in DTYPES:
        raise ArrayError(f"array {meta.name!r}: dtype {meta.dtype!r} is not one of {sorted(DTYPES)}")
    if any(d < 0 for d in meta.shape):
        raise ArrayError(f"array {meta.name!r}: negative dimension in shape {meta.shape}")
    dtype = np.dtype(meta.dtype).newbyteorder("<")
    want = int(np.prod(meta.shape, dtype=np.int64)) * dtype.itemsize
    got = memoryview(frame).nbytes
    if want != meta.nbytes or got != want:
        raise ArrayError(f"array {meta.name!r}: shape {meta.shape} x {meta.dtype} is {want} bytes, frame has {got}")
    return np.frombuffer(frame, dtype=dtype).reshape(meta.shape)


def leading(arrays: Mapping[str, Array], names: Iterable[str], n: int) -> None:
    """Check that each named array has `n` rows (one per slot)."""
    for name in names:
        if arrays[name].ndim == 0 or arrays[name].shape[0] != n:
            raise ArrayError(f"array {name!r} has shape {list(arrays[name].shape)}, expected {n} rows")
