"""A read-only string-keyed map whose versions share what they did not change.

`set` (and `without`) returns a new map and leaves the one it was called on as it was, copying one
bucket and two 32-slot index tuples rather than every entry. Projections are pure folds whose
earlier states a tick holds by reference on a worker thread (`ProjectionRunner.hold`); with a
plain dict, keeping an old state unchanged meant copying the whole per-host map on every
heartbeat (or command, or ack), a cost that grew with the fleet.

Layout: 1,024 buckets (32 pages of 32), a key's bucket chosen by the CRC-32 of its UTF-8 bytes
(stable across processes, unlike Python's salted `hash`). Up to tens of thousands of keys a bucket
holds a few dozen entries, so a `set` costs about the same at 1,000 keys as at 10,000.

Iteration (keys, values, items) is in sorted key order: what every reader sorted the plain dict
into, and what the deterministic encoder writes, so neither the layout nor the order keys were set
in is visible. `grid.events.codec` encodes it as the plain dict it reads as; a state decoded from
that dict converts it back (`SharedMap(mapping)`).
"""

from __future__ import annotations

import zlib
from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView
from operator import itemgetter
from typing import Any, TypeVar

import msgspec

V = TypeVar("V")

_SLOT_BITS = 5
_SLOTS = 1 << _SLOT_BITS  # buckets per page
_PAGES = 32
_MASK = _PAGES * _SLOTS - 1
# Shared by every map until a key lands in them: no bucket or page is ever changed after it is built.
_EMPTY_BUCKET: dict[str, Any] = {}
_EMPTY_PAGE: tuple[dict[str, Any], ...] = (_EMPTY_BUCKET,) * _SLOTS
_EMPTY_PAGES: tuple[tuple[dict[str, Any], ...], ...] = (_EMPTY_PAGE,) * _PAGES
_by_key = itemgetter(0)


def _bucket_of(key: str) -> int:
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) & _MASK


class SharedMap(Mapping[str, V]):
    __slots__ = ("_pages", "_len")

    _pages: tuple[tuple[dict[str, V], ...], ...]
    _len: int

    def __init__(self, entries: Mapping[str, V] | Iterable[tuple[str, V]] = ()) -> None:
        filled: dict[int, dict[str, V]] = {}
        for key, value in (entries.items() if isinstance(entries, Mapping) else entries):
            if not isinstance(key, str):
                raise TypeError(f"SharedMap keys are strings, not {type(key).__name__}")
            filled.setdefault(_bucket_of(key), {})[key] = value
        if not filled:
            self._pages, self._len = _EMPTY_PAGES, 0
            return
        self._pages = tuple(
            tuple(filled.get((p << _SLOT_BITS) | s, _EMPTY_BUCKET) for s in range(_SLOTS)) for p in range(_PAGES)
        )
        self._len = sum(len(b) for b in filled.values())

    @classmethod
    def _of(cls, pages: tuple[tuple[dict[str, V], ...], ...], length: int) -> SharedMap[V]:
        out = cls.__new__(cls)
        out._pages = pages
        out._len = length
        return out

    def set(self, key: str, value: V) -> SharedMap[V]:
        """This map with `key` bound to `value`; this map itself does not change."""
        h = _bucket_of(key)
        p, s = h >> _SLOT_BITS, h & (_SLOTS - 1)
        page = self._pages[p]
        bucket = page[s]
        length = self._len if key in bucket else self._len + 1
        changed = dict(bucket)
        changed[key] = value
        page = (*page[:s], changed, *page[s + 1:])
        return SharedMap._of((*self._pages[:p], page, *self._pages[p + 1:]), length)

    def without(self, key: str) -> SharedMap[V]:
        """This map with `key` unbound (this map itself when it has no `key`); this map itself
        does not change."""
        h = _bucket_of(key)
        p, s = h >> _SLOT_BITS, h & (_SLOTS - 1)
        page = self._pages[p]
        bucket = page[s]
        if key not in bucket:
            return self
        changed = dict(bucket)
        del changed[key]
        page = (*page[:s], changed if changed else _EMPTY_BUCKET, *page[s + 1:])
        return SharedMap._of((*self._pages[:p], page, *self._pages[p + 1:]), self._len - 1)

    def _bucket(self, key: object) -> dict[str, V] | None:
        if not isinstance(key, str):
            return None
        h = _bucket_of(key)
        return self._pages[h >> _SLOT_BITS][h & (_SLOTS - 1)]

    def __getitem__(self, key: str) -> V:
        bucket = self._bucket(key)
        if bucket is None:
            raise KeyError(key)
        return bucket[key]

    def get(self, key: str, default: Any = None) -> Any:
        bucket = self._bucket(key)
        return default if bucket is None else bucket.get(key, default)

    def __contains__(self, key: object) -> bool:
        bucket = self._bucket(key)
        return bucket is not None and key in bucket

    def __len__(self) -> int:
        return self._len

    def _sorted_items(self) -> list[tuple[str, V]]:
        items = [kv for page in self._pages for bucket in page if bucket for kv in bucket.items()]
        items.sort(key=_by_key)
        return items

    def __iter__(self) -> Iterator[str]:
        keys = [k for page in self._pages for bucket in page if bucket for k in bucket]
        keys.sort()
        return iter(keys)

    def items(self) -> ItemsView[str, V]:
        return _Items(self)

    def values(self) -> ValuesView[V]:
        return _Values(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SharedMap):
            return self._len == other._len and self._sorted_items() == other._sorted_items()
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # like a dict: equal by content, so unhashable

    def __repr__(self) -> str:
        return f"SharedMap({dict(self._sorted_items())!r})"


class _Items(ItemsView[str, V]):
    _mapping: SharedMap[V]

    def __iter__(self) -> Iterator[tuple[str, V]]:
        # One pass over the buckets, not a lookup per key.
        return iter(self._mapping._sorted_items())


class _Values(ValuesView[V]):
    _mapping: SharedMap[V]

    def __iter__(self) -> Iterator[V]:
        return iter([v for _, v in self._mapping._sorted_items()])


def share_fields(state: object, *names: str) -> None:
    """In a frozen state's `__post_init__`: each named field that holds a plain mapping (a state
    decoded from a snapshot, or built by hand) becomes a SharedMap, so every state folds alike."""
    for name in names:
        value = getattr(state, name)
        if not isinstance(value, SharedMap):
            msgspec.structs.force_setattr(state, name, SharedMap(value))
