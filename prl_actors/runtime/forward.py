"""`Forward`: a Core attribute that is another part's attribute (`epoch` is the log's, `stopped` the
lifecycle's ...), declared in one line instead of a property and its setter.

    class Core:
        epoch = Forward[int]("log", "epoch")  # core.epoch reads and writes core.log.epoch
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class Forward(Generic[T]):
    def __init__(self, part: str, attr: str, settable: bool = True) -> None:
        self.part, self.attr, self.settable = part, attr, settable

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Forward[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Forward[T] | T:
        if obj is None:
            return self
        value: T = getattr(getattr(obj, self.part), self.attr)
        return value

    def __set__(self, obj: object, value: T) -> None:
        if not self.settable:
            raise AttributeError(f"{self.attr} is read-only (it is {self.part}.{self.attr})")
        part: Any = getattr(obj, self.part)
        setattr(part, self.attr, value)
