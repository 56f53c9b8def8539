"""A table's pending rows held column by column, and the Arrow table DuckDB scans from them.

The sink appends each value straight to its column's list (no per-row tuple to transpose later),
and each column becomes one Arrow array in a single C-level conversion. Text columns may be
held as the log's raw bytes: they become an Arrow string array from one joined buffer and its
offsets, without a Python str per value, and are checked as UTF-8 in C (a column with invalid
bytes falls back to decoding each value with replacement characters, as a str column would).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from itertools import accumulate
from typing import Any

import pyarrow as pa

ARROW_TYPES: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(), "BIGINT": pa.int64(), "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_(),
}


def text_from_bytes(values: list[bytes]) -> pa.Array:
    """An Arrow string array of `values` (UTF-8 bytes), invalid bytes replaced like bytes.decode does."""
    offsets = array("q", accumulate(map(len, values), initial=0))
    out = pa.LargeStringArray.from_buffers(len(values), pa.py_buffer(offsets), pa.py_buffer(b"".join(values)))
    try:
        out.validate(full=True)
    except pa.ArrowInvalid:
        return pa.array([v.decode("utf-8", "replace") for v in values], type=pa.large_string())
    return out


class Columns:
    """Pending rows of one table. `appenders[i]` appends to column i; `row()` appends a whole row."""

    def __init__(self, columns: tuple[tuple[str, str], ...], *, bytes_columns: frozenset[str] = frozenset()) -> None:
        self.names = [name for name, _ in columns]
        self.types = [ARROW_TYPES[sql_type] for _, sql_type in columns]
        self.bytes_columns = bytes_columns
        self.lists: list[list[Any]] = [[] for _ in columns]
        self.appenders: tuple[Callable[[Any], None], ...] = tuple(col.append for col in self.lists)

    def __len__(self) -> int:
        return len(self.lists[0])

    def row(self, *values: Any) -> None:
        for append, value in zip(self.appenders, values, strict=True):
            append(value)

    def clear(self) -> None:
        for col in self.lists:
            col.clear()

    def to_arrow(self) -> pa.Table:
        arrays = [
            text_from_bytes(col) if name in self.bytes_columns else pa.array(col, type=ty)
            for name, ty, col in zip(self.names, self.types, self.lists)
        ]
        return pa.Table.from_arrays(arrays, names=self.names)

    def rows(self) -> list[tuple[Any, ...]]:
        """The pending rows as tuples, bytes columns decoded (for comparisons and baselines)."""
        cols = [
            [v.decode("utf-8", "replace") for v in col] if name in self.bytes_columns else col
            for name, col in zip(self.names, self.lists)
        ]
        return list(zip(*cols))
