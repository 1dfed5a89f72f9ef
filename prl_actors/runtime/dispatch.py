"""Dispatch, a part of every actor's Core: the handler table, message class -> method name.

A handler is a Core method marked `@handles(SomeMessage)` taking `Inbound[SomeMessage]`, so mypy
checks every field it reads. A class's table is collected over the class and its bases (subclasses
win; a method overridden by name keeps its base's message type)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from prl_actors.protocol.messages import Msg
from prl_actors.transport.port import Inbound

M = TypeVar("M", bound=Msg)
C = TypeVar("C")
HandlerFn = Callable[[C, float, Inbound[M]], None]


def handles(msg_type: type[M]) -> Callable[[HandlerFn[C, M]], HandlerFn[C, M]]:
    """Mark a Core method as the handler of `msg_type` (it receives `Inbound[msg_type]`)."""

    def mark(fn: HandlerFn[C, M]) -> HandlerFn[C, M]:
        fn.__handles__ = msg_type  # type: ignore[attr-defined]
        return fn

    return mark


def handler_table(cls: type) -> dict[type[Msg], str]:
    """message class -> handler method name, over the class and its bases."""
    table: dict[type[Msg], str] = {}
    for klass in reversed(cls.__mro__):
        for name, fn in vars(klass).items():
            msg_type: Any = getattr(fn, "__handles__", None)
            if msg_type is not None:
                table[msg_type] = name
    return table


def missing_handlers(table: dict[type[Msg], str], receives: frozenset[type[Msg]]) -> list[type[Msg]]:
    """The messages a role can receive (protocol.routes) that no handler takes: a core lacking one
    fails when it is built."""
    return [t for t in receives if t not in table]
