"""The GPU weight path's bucket plan and broadcast protocol, run with gloo on CPU (two ranks as two
threads of this process, each with its own directly built process group). NCCL itself is unverified."""

from __future__ import annotations

import threading

import torch

from prl_actors.protocol.messages import TensorMeta
from prl_actors.weights import pack
from prl_actors.weights_nccl import broadcast_weights, plan_buckets, receive_weights, sync_group
from prl_bench.common import free_port


def meta(name: str, dtype: str, *shape: int) -> TensorMeta:
    size = {"float32": 4, "bfloat16": 2, "int64": 8}[dtype]
    n = 1
    for d in shape:
        n *= d
    return TensorMeta(name=name, dtype=dtype, shape=list(shape), nbytes=n * size)


def test_buckets_pack_one_dtype_up_to_the_size_and_keep_table_order() -> None:
    metas = [meta("a", "float32", 4), meta("b", "bfloat16", 8), meta("c", "float32", 2, 2), meta("d", "float32", 64)]
    plan = plan_buckets(metas, bucket_bytes=40)
    assert [(b.dtype, b.names, b.nbytes) for b in plan] == [
        ("float32", ["a", "c"], 32),
        ("bfloat16", ["b"], 16),
        ("float32", ["d"], 256),  # larger than a bucket: a bucket of its own
    ]
    assert sorted(n for b in plan for n in b.names) == ["a", "b", "c", "d"]


def test_a_version_crosses_the_group_in_buckets_bit_for_bit() -> None:
    torch.manual_seed(0)
    tensors = {
        "embed": torch.randn(16, 8),
        "norm": torch.randn(8).to(torch.bfloat16),
        "layer.w": torch.randn(8, 8),
        "count": torch.arange(5),
    }
    metas, _ = pack(tensors)
    port, got, errors = free_port(), {}, []

    def rank(r: int) -> None:
        try:
            group = sync_group("gloo", "127.0.0.1", port, r, 2, timeout_s=30)
            if r == 0:
                broadcast_weights(group, tensors, metas, "cpu", bucket_bytes=300)
            else:
                got.update(receive_weights(group, metas, "cpu", bucket_bytes=300))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(plan_buckets(metas, 300)) == 4  # several broadcasts, not one per tensor nor one in all
    assert got.keys() == tensors.keys()
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
