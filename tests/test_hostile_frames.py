"""Bounded decoding: every hostile frame becomes a ProtocolError with a code, nothing else escapes."""

from __future__ import annotations

import random

import msgspec
import pytest

from prl_actors.protocol import PROTOCOL_VERSION, ProtocolError, decode, encode
from prl_actors.protocol import messages as m
from tests import fuzzframes


def refused(frames: list[bytes], **kw: int) -> ProtocolError:
    with pytest.raises(ProtocolError) as err:
        decode(frames, **kw)
    return err.value


def test_the_six_byte_frame_of_issue_12_is_an_error_not_a_crash() -> None:
    frame = b"\x81\xa2id\xa1\xff"  # {"id": <1-byte string that is not UTF-8>}
    assert len(frame) == 6
    assert refused([frame]).code in ("malformed", "bad_protocol")


def map_frame(fields: dict[str, bytes]) -> bytes:
    """A MessagePack map from already-encoded values (so a value can be any byte string)."""
    return bytes([0x80 | len(fields)]) + b"".join(msgspec.msgpack.encode(k) + v for k, v in fields.items())


@pytest.mark.parametrize("field", ["type", "id", "sender", "role"])
def test_invalid_utf8_in_any_string_is_an_error(field: str) -> None:
    good = {"proto": PROTOCOL_VERSION, "type": "register", "id": "a", "sender": "worker-1", "role": "worker"}
    fields = {k: msgspec.msgpack.encode(v) for k, v in good.items()}
    fields[field] = b"\xa2\xc3\x28"  # a 2-byte string that is not UTF-8
    assert refused([map_frame(fields)]).code in ("malformed", "unknown_type")


@pytest.mark.parametrize("depth", [1100, 100_000])
@pytest.mark.parametrize("key", [b"proto", b"extra", b"busy_groups"])
def test_deep_nesting_is_malformed(depth: int, key: bytes) -> None:
    head = {"proto": PROTOCOL_VERSION, "type": "heartbeat", "id": "x"}
    head.pop(key.decode(), None)
    body = b"".join(msgspec.msgpack.encode(k) + msgspec.msgpack.encode(v) for k, v in head.items())
    frame = bytes([0x80 | (len(head) + 1)]) + body + msgspec.msgpack.encode(key.decode()) + b"\x91" * depth + b"\x01"
    assert refused([frame]).code in ("malformed", "bad_protocol")


@pytest.mark.parametrize("prefix", fuzzframes.HUGE)
def test_huge_length_prefixes_are_malformed_without_allocating(prefix: bytes) -> None:
    frame = b"\x83\xa5proto\x03\xa4type\xa9heartbeat\xa2id" + prefix + b"ab"
    assert refused([frame]).code == "malformed"


def test_raw_frames_only_where_the_type_has_them() -> None:
    frames = encode(m.Heartbeat(), [b"junk"])
    assert refused(frames).code == "malformed"
    chunk = m.WeightChunk(transfer="t", index=0, offset=0, nbytes=1)
    assert refused(encode(chunk, [b"a", b"b"])).code == "malformed"
    assert decode(encode(chunk, [b"a"]))[1] == [b"a"]


def test_frame_size_limit_and_echo_is_short() -> None:
    big = encode(m.Leave(reason="x" * 5000))
    assert refused(big, max_bytes=1000).code == "malformed"
    err = refused([msgspec.msgpack.encode({"proto": PROTOCOL_VERSION, "type": "t" * 10_000, "id": "i" * 10_000})])
    assert err.code == "unknown_type" and len(err.detail) < 200 and len(err.reply_to) < 120


def fuzz(n: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    codes: dict[str, int] = {}
    for _ in range(n):
        try:
            decode(fuzzframes.frames(rng), max_bytes=1 << 20)
            codes["ok"] = codes.get("ok", 0) + 1
        except ProtocolError as err:  # anything else fails the test
            codes[err.code] = codes.get(err.code, 0) + 1
    return codes


def test_codec_fuzz_small() -> None:
    codes = fuzz(20_000, seed=12)
    assert codes["malformed"] > 1000 and codes.get("ok", 0) > 100, codes


@pytest.mark.slow
def test_codec_fuzz_100k() -> None:
    codes = fuzz(100_000, seed=1212)
    assert codes["malformed"] > 10_000, codes
