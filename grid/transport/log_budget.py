"""The log budget: how much disk the grid's JetStream streams may reserve together.

The server reserves every stream's max_bytes up front and refuses a stream that does not fit
its file store (by default 75% of the store directory's free space), so the streams' sizes must
follow the disk they live on. `gridctl up --log-budget SIZE` (or GRID_LOG_BUDGET) sets it; by
default it is the policies' own total or a quarter of the free space, whichever is less, and
never below MIN_LOG_BUDGET. grid.transport.jetstream.stream_byte_limits splits it across streams.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from grid.transport.jetstream import DEFAULT_LOG_BUDGET, MIB, MIN_LOG_BUDGET

LOG_BUDGET_ENV = "GRID_LOG_BUDGET"
# nats-server's file store takes at most this share of the free space it finds at start.
SERVER_STORE_FRACTION = 0.75
# The default budget takes at most this share of the free space (the rest stays the machine's).
DEFAULT_FREE_FRACTION = 0.25

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class LogBudgetError(ValueError):
    pass


def parse_size(text: str) -> int:
    """'512MiB', '2G', '1.5GiB', '300M' or plain bytes (K, M, G, T are powers of 1024)."""
    match = _SIZE.match(text)
    if match is None:
        raise LogBudgetError(f"a size such as 512MiB, 2GiB or 4G, not {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def human(size: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{int(size)} bytes"


def free_bytes(directory: Path) -> int:
    """Free space where `directory` is (or will be: its nearest existing parent)."""
    path = Path(directory).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def resolve_log_budget(requested: str | None, store_dir: Path, *, free: int | None = None) -> int:
    """The budget in bytes for streams stored under `store_dir`, or LogBudgetError saying why it
    cannot fit (the free space, the minimum, and the flag that sets it)."""
    free = free_bytes(store_dir) if free is None else free
    usable = int(free * SERVER_STORE_FRACTION)
    where = f"{human(free)} free under {store_dir}"
    if requested is not None:
        budget = parse_size(requested)
        if budget < MIN_LOG_BUDGET:
            raise LogBudgetError(f"--log-budget {requested} is below the minimum of {MIN_LOG_BUDGET // MIB} MiB")
        if budget > usable:
            raise LogBudgetError(
                f"--log-budget {requested} does not fit: {where}, and the NATS server reserves at most "
                f"{int(SERVER_STORE_FRACTION * 100)}% of it ({human(usable)}); free disk space or pass a smaller "
                f"--log-budget (at least {MIN_LOG_BUDGET // MIB} MiB)")
        return budget
    budget = max(MIN_LOG_BUDGET, min(DEFAULT_LOG_BUDGET, int(free * DEFAULT_FREE_FRACTION)))
    if budget > usable:
        raise LogBudgetError(
            f"not enough disk for the event log: {where}, and even the minimum log budget of "
            f"{MIN_LOG_BUDGET // MIB} MiB needs {human(MIN_LOG_BUDGET / SERVER_STORE_FRACTION)} free; free disk space, "
            f"or set GRID_HOME elsewhere (--log-budget SIZE / {LOG_BUDGET_ENV} sets the budget)")
    return budget
