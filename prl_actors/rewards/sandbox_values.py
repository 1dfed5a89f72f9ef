"""Plain data across the sandbox's pipe: `encode` runs inside (sandbox_harness.py), `decode` here
and in the judge. Tagged JSON lists: ["i", "0xc"], ["f", "nan"], ["s", "x"], ["y", hex], ["n"],
["B", true], ["c", re, im], ["l"|"t"|"S"|"F", [items]], ["d", [[key, value], ...]]. Only plain
types round-trip (subclasses become their base type); anything else is a TypeError inside, so a
probe's value is data, never an object whose `__eq__` the program wrote.
Stdlib only and light (imported by the harness at every sandbox start).
"""

from __future__ import annotations

from collections.abc import Callable  # no `typing`: ~10 ms at every sandbox start

MAX_DEPTH = 64  # nesting of a value
CONTAINERS: dict[str, Callable[[list[object]], object]] = {"l": list, "t": tuple, "S": set, "F": frozenset}
SCALARS: dict[str, Callable[..., object]] = {"i": lambda x: int(x, 16), "f": float, "s": str, "y": bytes.fromhex}


def encode(value: object, depth: int = 0) -> list[object]:
    """`value` as tagged JSON-able data; TypeError for anything but plain data (runs inside)."""
    if depth > MAX_DEPTH:
        raise TypeError("too deep")
    if value is None or isinstance(value, bool):
        return ["n"] if value is None else ["B", bool(value)]
    if isinstance(value, int):
        return ["i", hex(int(value))]  # hex: no limit on digits (decimal strings stop at 4300)
    if isinstance(value, float):
        return ["f", repr(float(value))]
    if isinstance(value, str):
        return ["s", str(value)]
    if isinstance(value, complex):
        return ["c", repr(value.real), repr(value.imag)]
    if isinstance(value, bytes | bytearray):
        return ["y", bytes(value).hex()]
    for tag, kind in (("l", list), ("t", tuple), ("F", frozenset), ("S", set)):
        if isinstance(value, kind):
            return [tag, [encode(x, depth + 1) for x in value]]  # type: ignore[attr-defined]
    if isinstance(value, dict):
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    raise TypeError(f"not plain data: {type(value).__name__}")


def decode(data: object, depth: int = 0) -> object:
    """The value `encode` made; ValueError/TypeError for anything else (it comes from the sandbox)."""
    if depth > MAX_DEPTH or not isinstance(data, list) or not data or not isinstance(data[0], str):
        raise ValueError("not an encoded value")
    tag, args = data[0], data[1:]
    if tag == "n" and not args:
        return None
    if tag == "B" and len(args) == 1 and isinstance(args[0], bool):
        return args[0]
    if tag in SCALARS and len(args) == 1 and isinstance(args[0], str):
        return SCALARS[tag](args[0])
    if tag == "c" and len(args) == 2 and all(isinstance(a, str) for a in args):
        return complex(float(args[0]), float(args[1]))
    if tag in CONTAINERS and len(args) == 1 and isinstance(args[0], list):
        return CONTAINERS[tag]([decode(x, depth + 1) for x in args[0]])
    if tag == "d" and len(args) == 1 and isinstance(args[0], list):
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in map(_pair, args[0])}
    raise ValueError(f"not an encoded value: tag {tag!r}")


def _pair(item: object) -> tuple[object, object]:
    if not isinstance(item, list) or len(item) != 2:
        raise ValueError("not a key-value pair")
    return item[0], item[1]
