"""GPU trainer -> GPU workers: weights by collective broadcast in packed buckets (code path).

STATUS: the NCCL path is unverified (no GPU was available); the bucket plan and the broadcast
protocol are tested with gloo on CPU (tests/test_distributed_slow.py), and the protocol does not
negotiate this transport yet (docs/DISTRIBUTED.md, docs/PROTOCOL.md). torch.distributed is imported
lazily; nothing here runs unless a caller builds a `sync_group`.

A weight-sync group is its own process group, apart from the trainer's and from vLLM's: trainer rank
0 (the source, rank 0 here) and one rank per receiving device (a worker, or each TP rank of a vLLM
worker through its extension). It is built from a TCPStore by constructing the backend's
ProcessGroup directly, so no process needs it as its default group.

Per version the source broadcasts `plan_buckets(metas)`: tensors of one dtype packed back to back
into flat buckets of at most `bucket_bytes` (one broadcast per bucket: few large transfers, not one
per tensor). Receivers know the plan from the tensor table they already get (`weights_begin`), so
only raw bucket bytes cross the group, and each tensor is a view of its bucket.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prl_actors.protocol.messages import TensorMeta

DEFAULT_BUCKET_BYTES = 256 << 20


@dataclass
class Bucket:
    dtype: str
    names: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    numels: list[int] = field(default_factory=list)
    nbytes: int = 0


def plan_buckets(metas: list[TensorMeta], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Bucket]:
    """Tensors grouped by dtype (table order kept within a dtype), each group cut into buckets of at
    most `bucket_bytes` (a tensor larger than that is a bucket of its own)."""
    buckets: list[Bucket] = []
    open_by_dtype: dict[str, Bucket] = {}
    for m in metas:
        b = open_by_dtype.get(m.dtype)
        if b is None or (b.nbytes and b.nbytes + m.nbytes > bucket_bytes):
            b = open_by_dtype[m.dtype] = Bucket(m.dtype)
            buckets.append(b)
        numel = 1
        for d in m.shape:
            numel *= d
        b.names.append(m.name)
        b.shapes.append(list(m.shape))
        b.numels.append(numel)
        b.nbytes += m.nbytes
    return buckets


def sync_group(backend: str, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> Any:
    """A process group of its own (`nccl` on GPUs; `gloo` for tests), rank 0 serving the store."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.PrefixStore("prl-weights/", dist.TCPStore(host, port, world_size, rank == 0, timeout))
    if backend == "nccl":  # unverified: no GPU here
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def broadcast_weights(
    group: Any,
    tensors: Mapping[str, Any],
    metas: list[TensorMeta],
    device: Any,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> None:
    """The source (rank 0): every bucket of `tensors` (in `metas` order) to every rank."""
    import torch

    for b in plan_buckets(metas, bucket_bytes):
        flat = torch.cat([tensors[n].detach().reshape(-1) for n in b.names]).to(device)  # [sum numels]
        group.broadcast([flat], _options(0)).wait()


def receive_weights(
    group: Any, metas: list[TensorMeta], device: Any, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> dict[str, Any]:
    """A receiver: the tensors of the plan, each a view of its bucket on `device`."""
    import torch

    out: dict[str, Any] = {}
    for b in plan_buckets(metas, bucket_bytes):
        flat = torch.empty(sum(b.numels), dtype=getattr(torch, b.dtype), device=device)  # [sum numels]
        group.broadcast([flat], _options(0)).wait()
        for name, shape, part in zip(b.names, b.shapes, flat.split(b.numels), strict=True):
            out[name] = part.view(shape)
    return out


def _options(root: int) -> Any:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = root
    return opts
