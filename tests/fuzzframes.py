"""A seeded generator of hostile ZeroMQ messages for the codec and for a live run's sockets.

Each call gives one multipart message (a list of frames) from one of these families, chosen at random:
random bytes; a valid message with bytes flipped, cut or inserted; a valid header whose fields hold
values of the wrong type or shape; nesting 50 to 200,000 levels deep in a known or an unknown field;
invalid UTF-8 in a key, the type tag, the id, the sender or a nested string; length prefixes of up to
2^32 - 1 (str, bin, array, map, ext) with a few bytes behind them; extra raw frames; and well-formed
messages of every type with arbitrary field values (negative counts, huge ids, empty groups, ...).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgspec

from prl_actors.protocol.messages import MESSAGE_TYPES, PROTOCOL_VERSION, Msg
from tests.test_protocol import sample_messages

Frames = list[bytes]
SAMPLES = sample_messages()
_enc = msgspec.msgpack.Encoder()
BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80abc"]
HUGE = [b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff",
        b"\xc9\xff\xff\xff\xff\x01", b"\xda\xff\xff", b"\xdc\xff\xff", b"\xde\xff\xff"]  # fmt: skip


def _fixstr(b: bytes) -> bytes:
    return bytes([0xA0 | len(b)]) + b if len(b) < 32 else b"\xd9" + bytes([len(b)]) + b


def _value(rng: random.Random, depth: int = 0) -> Any:
    """A random MessagePack-able value (ints of every width, floats, strings, bytes, containers)."""
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return rng.choice([0, -1, 1, 2**31, -(2**63), 2**64 - 1, rng.randrange(-1000, 1000)])
    if kind == 1:
        return rng.choice([0.0, -1.5, float("inf"), float("nan"), 1e308])
    if kind == 2:
        return "".join(rng.choice("ab-_é\x00worker") for _ in range(rng.randrange(12)))
    if kind == 3:
        return rng.randbytes(rng.randrange(8))
    if kind == 4:
        return rng.choice([None, True, False])
    if kind == 5:
        return rng.choice(["worker-0", "buffer", "trainer", "coordinator", "operator", "publisher"])
    if kind == 6:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        return {str(_value(rng, depth + 1)): _value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return {"group_id": rng.randrange(-2, 50), "samples": [], "prompt": "x", "prompt_ids": [], "worker": "w"}


def _valid(rng: random.Random) -> bytes:
    return _enc.encode(rng.choice(SAMPLES))


def random_bytes(rng: random.Random) -> Frames:
    return [rng.randbytes(rng.randrange(0, 64))]


def mutated(rng: random.Random) -> Frames:
    raw = bytearray(_valid(rng))
    for _ in range(rng.randrange(1, 6)):
        op, i = rng.randrange(3), rng.randrange(max(1, len(raw)))
        if op == 0 and raw:
            raw[i] = rng.randrange(256)
        elif op == 1:
            del raw[i:]
        else:
            raw[i:i] = rng.randbytes(rng.randrange(1, 6))
    return [bytes(raw)]


def wrong_fields(rng: random.Random) -> Frames:
    """A real message as a dict with some fields replaced by values of any type (or removed)."""
    d = msgspec.to_builtins(rng.choice(SAMPLES))
    for key in rng.sample(sorted(d), k=rng.randrange(1, len(d))):
        if key in ("proto", "type") and rng.random() < 0.7:
            continue
        if rng.random() < 0.2:
            del d[key]
        else:
            d[key] = _value(rng)
    if rng.random() < 0.3:
        d[str(_value(rng))] = _value(rng)
    return [_enc.encode(d)]


def deep(rng: random.Random) -> Frames:
    depth = rng.choice([50, 900, 1100, 5000, 200_000])
    opener = rng.choice([b"\x91", b"\x81\xa1k"])  # [[[...]]] or {"k": {"k": ...}}
    key = rng.choice([b"proto", b"type", b"id", b"sender", b"extra", b"metrics", b"group", b"busy_groups"])
    head = {"proto": PROTOCOL_VERSION, "type": rng.choice(list(MESSAGE_TYPES)), "id": "x"}
    head.pop(key.decode(), None)
    body = b"".join(_fixstr(k.encode()) + _enc.encode(v) for k, v in head.items())
    return [bytes([0x80 | (len(head) + 1)]) + body + _fixstr(key) + opener * depth + b"\x01"]


def bad_utf8(rng: random.Random) -> Frames:
    bad = rng.choice(BAD_UTF8)
    where = rng.randrange(5)
    if where == 0:  # the 6-byte frame of issue 12: a map whose only string is not UTF-8
        return [b"\x81\xa2id" + _fixstr(bad)[:2]]
    head = {"proto": PROTOCOL_VERSION, "type": "register", "id": "a", "sender": "worker-9", "role": "worker"}
    body = b"".join(_fixstr(k.encode()) + _enc.encode(v) for k, v in head.items())
    if where == 1:  # a bad key
        return [bytes([0x80 | (len(head) + 1)]) + body + _fixstr(bad) + b"\x01"]
    name = ["type", "id", "sender", "role"][where - 1] if where < 5 else "role"
    body = b"".join(_fixstr(k.encode()) + (_fixstr(bad) if k == name else _enc.encode(v)) for k, v in head.items())
    return [bytes([0x80 | len(head)]) + body]


def huge_prefix(rng: random.Random) -> Frames:
    key = rng.choice([b"id", b"sender", b"extra", b"busy_groups", b"group"])
    prefix = rng.choice(HUGE) + rng.randbytes(rng.randrange(0, 16))
    head = {"proto": PROTOCOL_VERSION, "type": rng.choice(["heartbeat", "group_result", "status_request"])}
    body = b"".join(_fixstr(k.encode()) + _enc.encode(v) for k, v in head.items())
    return [bytes([0x80 | 3]) + body + _fixstr(key) + prefix]


def extra_frames(rng: random.Random) -> Frames:
    return [_valid(rng), *[rng.randbytes(rng.randrange(0, 32)) for _ in range(rng.randrange(1, 4))]]


def odd_values(rng: random.Random) -> Frames:
    """A well-formed message of any type whose fields hold legal but strange values."""
    msg: Msg = msgspec.structs.replace(rng.choice(SAMPLES))
    for f in msg.__struct_fields__:
        if f in ("proto",) or rng.random() < 0.5:
            continue
        cur = getattr(msg, f)
        if isinstance(cur, bool):
            continue
        if isinstance(cur, int):
            setattr(msg, f, rng.choice([-1, 0, 10**9, -(2**63), 2**63 - 1, rng.randrange(-5, 40)]))
        elif isinstance(cur, str) and f not in ("type",):
            setattr(msg, f, rng.choice(["", "worker-0", "buffer", "x" * 200, "trainer"]))
        elif isinstance(cur, bytes):
            setattr(msg, f, rng.randbytes(rng.randrange(0, 40)))
    try:
        return [_enc.encode(msg)]
    except (OverflowError, TypeError):
        return [_valid(rng)]


FAMILIES: list[Callable[[random.Random], Frames]] = [
    random_bytes, mutated, wrong_fields, deep, bad_utf8, huge_prefix, extra_frames, odd_values,
]  # fmt: skip


def frames(rng: random.Random) -> Frames:
    """One hostile multipart message."""
    return rng.choice(FAMILIES)(rng)
