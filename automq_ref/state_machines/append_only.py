"""An immutable sequence with O(1) append, for machine states that grow record by record.

A LogCache block takes every record the WAL makes durable; as a tuple, each append copied the
whole block (quadratic: a block of 100,000 records cost seconds per second of appends). Here
successive versions share one list: version ``k`` sees the first ``k`` items, and appending to
the newest version extends the list in place. Appending to an older version (one another
version was already appended to) copies that version's items first, so no version ever changes:
the sequence is immutable to every observer, as a frozen state requires.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Generic, TypeVar, overload

T = TypeVar("T")


class AppendOnly(Sequence[T], Generic[T]):
    __slots__ = ("_items", "_length")

    _items: list[T]
    _length: int

    def __init__(self, items: Iterable[T] = ()) -> None:
        self._items = list(items)
        self._length = len(self._items)

    @classmethod
    def _version(cls, items: list[T], length: int) -> AppendOnly[T]:
        version: AppendOnly[T] = cls.__new__(cls)
        version._items = items
        version._length = length
        return version

    def appended(self, item: T) -> AppendOnly[T]:
        """This sequence plus ``item`` (this one is unchanged)."""
        items = self._items
        if len(items) != self._length:
            items = items[: self._length]  # a later version exists: branch off a copy
        items.append(item)
        return AppendOnly._version(items, self._length + 1)

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        if isinstance(index, slice):
            return tuple(self._items[: self._length][index])
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(f"index {index} out of range for {self._length} items")
        return self._items[index]

    def __iter__(self) -> Iterator[T]:
        return itertools.islice(self._items, self._length)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AppendOnly | tuple | list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"AppendOnly({list(self)!r})"
