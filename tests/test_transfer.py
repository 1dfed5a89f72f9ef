"""Chunked weight transfer: exact bytes for numpy and torch (bf16 too); broken transfers are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from prl_actors.protocol import decode, encode
from prl_actors.protocol import messages as m
from prl_actors.weights.tensors import unpack
from prl_actors.weights.transfer import Assembler, Snapshot, TransferError, transfer_messages

pytestmark = pytest.mark.fast


def ship(snap: Snapshot, chunk_bytes: int, drop: int | None = None) -> Snapshot:
    """Send through the real codec (encode/decode every frame) and reassemble."""
    asm = None
    for i, (msg, payloads) in enumerate(transfer_messages(snap, chunk_bytes)):
        if drop is not None and i == drop + 1:
            continue
        msg, payloads = decode(encode(msg, payloads))
        if isinstance(msg, m.WeightsBegin):
            asm = Assembler(msg, 0.0)
        elif isinstance(msg, m.WeightChunk):
            asm.chunk(msg, payloads)  # type: ignore[union-attr]
        else:
            return asm.end(msg)  # type: ignore[union-attr,arg-type]
    raise AssertionError("no WeightsEnd")


def test_numpy_round_trip_over_many_chunks() -> None:
    rng = np.random.default_rng(0)
    tensors = {
        "a": rng.standard_normal((33, 7)).astype(np.float32),
        "b": np.arange(5, dtype=np.int64),
        "c": np.zeros(0),
    }
    got = unpack(*_metas_data(ship(Snapshot.from_tensors(3, tensors), chunk_bytes=100)))
    for k, v in tensors.items():
        np.testing.assert_array_equal(got[k], v)
        assert got[k].dtype == v.dtype


def test_torch_bf16_round_trip() -> None:
    tensors = {"w": torch.randn(4, 8, dtype=torch.bfloat16), "b": torch.randn(8)}
    snap = ship(Snapshot.from_tensors(1, tensors), chunk_bytes=16)
    assert snap.version == 1
    got = unpack(*_metas_data(snap), as_torch=True)
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], tensors["w"])
    assert torch.equal(got["b"], tensors["b"])


def test_missing_chunk_is_refused() -> None:
    snap = Snapshot.from_tensors(1, {"a": np.ones(100, dtype=np.float32)})
    with pytest.raises(TransferError, match="missing"):
        ship(snap, chunk_bytes=64, drop=2)


def test_inconsistent_begin_is_refused() -> None:
    meta = m.TensorMeta(name="a", dtype="float32", shape=[4], nbytes=16)
    with pytest.raises(TransferError, match="total_bytes"):
        Assembler(m.WeightsBegin(tensors=[meta], total_bytes=15, chunks=1), 0.0)


def _metas_data(snap: Snapshot) -> tuple[list[m.TensorMeta], memoryview]:
    return snap.metas, snap.data
