"""`--workload-trace WORKLOAD=CSV`: a bounded, validated request-rate series for one workload.

A headerless CSV of (timestamp seconds, request rate) in its first two columns; further
columns are ignored. The trace is mapped onto the scenario's minutes and its mean normalised to
the built-in curve's mean for that workload, so it changes burst timing, not the offered-demand
scale. Bounded at 5 MiB and 100,000 rows; rates must be finite and non-negative, timestamps
finite and strictly increasing. Bad input is a TraceError with a message naming the line.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from grid.events.requests import WORKLOADS

MAX_TRACE_BYTES = 5 * 1024 * 1024
MAX_TRACE_ROWS = 100_000


class TraceError(ValueError):
    """A trace that cannot be used, with a message fit for the operator."""


def parse_option(option: str) -> tuple[str, Path]:
    """`WORKLOAD=PATH` -> (workload, path)."""
    workload, sep, path = option.partition("=")
    workload = workload.strip()
    if not sep or not workload or not path:
        raise TraceError(f"--workload-trace expects WORKLOAD=CSV, got {option!r}")
    if workload not in WORKLOADS:
        raise TraceError(f"unknown workload {workload!r} in --workload-trace (one of: {', '.join(WORKLOADS)})")
    return workload, Path(path)


def read_trace(path: Path) -> list[tuple[float, float]]:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    if size > MAX_TRACE_BYTES:
        raise TraceError(f"trace {path} is {size} bytes; the limit is {MAX_TRACE_BYTES} (5 MiB)")
    with open(path, "rb") as f:
        data = f.read(MAX_TRACE_BYTES + 1)
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"trace {path} is larger than {MAX_TRACE_BYTES} bytes (5 MiB)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"trace {path} is not UTF-8 text") from None
    return parse_rows(text, str(path))


def parse_rows(text: str, name: str = "trace") -> list[tuple[float, float]]:
    rows: list[tuple[float, float]] = []
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or all(not c.strip() for c in row):
            continue
        if len(rows) >= MAX_TRACE_ROWS:
            raise TraceError(f"{name} has more than {MAX_TRACE_ROWS} rows")
        if len(row) < 2:
            raise TraceError(f"{name} line {lineno}: needs a timestamp and a rate")
        try:
            ts, rate = float(row[0]), float(row[1])
        except ValueError:
            raise TraceError(f"{name} line {lineno}: timestamp and rate must be numbers") from None
        if not math.isfinite(ts):
            raise TraceError(f"{name} line {lineno}: timestamp is not finite")
        if not math.isfinite(rate) or rate < 0:
            raise TraceError(f"{name} line {lineno}: rate must be finite and non-negative")
        if rows and ts <= rows[-1][0]:
            raise TraceError(f"{name} line {lineno}: timestamps must be strictly increasing")
        rows.append((ts, rate))
    if len(rows) < 2:
        raise TraceError(f"{name} needs at least two rows")
    return rows


def curve(rows: list[tuple[float, float]], minutes: int, builtin: tuple[float, ...]) -> tuple[float, ...]:
    """The trace mapped onto `minutes` (step-wise), its mean scaled to the built-in curve's mean."""
    t0, t1 = rows[0][0], rows[-1][0]
    out: list[float] = []
    j = 0
    for m in range(minutes):
        t = t0 + (m + 0.5) / minutes * (t1 - t0)
        while j + 1 < len(rows) and rows[j + 1][0] <= t:
            j += 1
        out.append(rows[j][1])
    mean = sum(out) / len(out)
    target = sum(builtin) / len(builtin) if builtin else 1.0
    if mean <= 0:
        return tuple(0.0 for _ in out)
    return tuple(round(x * target / mean, 6) for x in out)
