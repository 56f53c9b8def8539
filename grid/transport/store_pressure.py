"""Disk pressure on the embedded JetStream store: how close the log is to a full disk, and whether
the server has already stopped storing.

nats-server stops storing on a stream whose block write failed (a full disk): publishes to it
time out without an ack, its full health check reports "JetStream stream ... write error", and
it stays so after the space is freed until the server is restarted. Heartbeats then stop being
stored and every host goes stale. `assess` turns what the supervisor reads (free space on the
store's filesystem, the server's JetStream usage and its health) into one value with a reason,
and says when a restart will bring the store back: only once there is room again for what the
streams reserve, since a server started on a full disk refuses the streams that do not fit.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from grid.transport.log_budget import SERVER_STORE_FRACTION

MIB = 1 << 20
GIB = 1 << 30

# Reason constants (the `state` of a StorePressure).
STORE_OK = "ok"
STORE_LOW_SPACE = "low_free_space"  # free space below the warning threshold: writes will fail soon
STORE_WRITE_FAILED = "write_failed"  # the server has stopped storing (a write failed)
STORE_UNKNOWN = "unknown"  # the server's monitor did not answer
STORE_STATES = (STORE_OK, STORE_LOW_SPACE, STORE_WRITE_FAILED, STORE_UNKNOWN)

# Warn when free space falls below a tenth of the filesystem, within these bounds (a big disk
# warns at 1 GiB free, a small one at 32 MiB).
WARN_FREE_FRACTION = 0.10
WARN_FREE_BOUNDS = (32 * MIB, 1 * GIB)
# A restart needs room for the streams' reservations, plus this for the server's own files.
RESTART_MARGIN_BYTES = 16 * MIB
# What a server's health error says when a stream stopped storing.
_WRITE_ERROR_MARKERS = ("write error", "no space left on device")


class StorePressure(msgspec.Struct, frozen=True, kw_only=True):
    """One reading of the store. Bytes; None where it could not be read."""

    state: str
    detail: str
    path: str
    free_bytes: int
    total_bytes: int
    warn_free_bytes: int
    jetstream_storage_bytes: int | None
    jetstream_reserved_bytes: int | None
    jetstream_max_bytes: int | None
    # Free space a restart needs before it can bring the streams back (their reservations).
    restart_needs_free_bytes: int
    # Times the supervisor restarted the server to bring a failed store back.
    recoveries: int = 0

    @property
    def recoverable(self) -> bool:
        """The server stopped storing and there is room again: a restart brings the store back."""
        return self.state == STORE_WRITE_FAILED and self.free_bytes >= self.restart_needs_free_bytes


def warn_free_bytes(total_bytes: int) -> int:
    low, high = WARN_FREE_BOUNDS
    return max(low, min(high, int(total_bytes * WARN_FREE_FRACTION)))


def restart_needs_free_bytes(reserved_bytes: int | None) -> int:
    """Free space at which a restarted server can take the streams' reservations again."""
    return int((reserved_bytes or 0) / SERVER_STORE_FRACTION) + RESTART_MARGIN_BYTES


def write_failure(health_error: str | None) -> bool:
    text = (health_error or "").lower()
    return any(marker in text for marker in _WRITE_ERROR_MARKERS)


def assess(*, path: Path | str, free_bytes: int, total_bytes: int, jsz: Mapping[str, Any] | None,
           health_error: str | None, reachable: bool, reserved_bytes: int | None = None,
           recoveries: int = 0) -> StorePressure:
    """The pressure on a store from one reading (pure). `jsz` is the server's /jsz document (None
    when unread), `health_error` its full health check's error (None when healthy), `reserved_bytes`
    the streams' reservations when `jsz` could not say (the last known value)."""
    warn = warn_free_bytes(total_bytes)
    config = (jsz or {}).get("config") or {}
    reserved = (jsz or {}).get("reserved_storage", reserved_bytes) if jsz is not None else reserved_bytes
    needs = restart_needs_free_bytes(reserved)
    if not reachable:
        state, detail = STORE_UNKNOWN, "the NATS server's monitor did not answer"
    elif write_failure(health_error):
        state = STORE_WRITE_FAILED
        detail = f"the NATS server stopped storing: {health_error}"
        if free_bytes < needs:
            detail += (f"; it is restarted once {needs // MIB} MiB are free on its filesystem "
                       f"({free_bytes // MIB} MiB now)")
    elif free_bytes < warn:
        state = STORE_LOW_SPACE
        detail = (f"{free_bytes // MIB} MiB free on the event log's filesystem, below the warning threshold of "
                  f"{warn // MIB} MiB; when it runs out, heartbeats stop being stored and hosts go stale")
    else:
        state, detail = STORE_OK, ""
    return StorePressure(
        state=state, detail=detail, path=str(path), free_bytes=free_bytes, total_bytes=total_bytes,
        warn_free_bytes=warn, jetstream_storage_bytes=(jsz or {}).get("storage") if jsz is not None else None,
        jetstream_reserved_bytes=reserved, jetstream_max_bytes=config.get("max_storage"),
        restart_needs_free_bytes=needs, recoveries=recoveries,
    )


def read_store(store_dir: Path, monitor: Callable[[str], tuple[int, Any]], *, reserved_bytes: int | None = None,
               recoveries: int = 0) -> StorePressure:
    """Read the store's filesystem and the server's monitor (`monitor(path)` -> (HTTP status, JSON
    body), raising OSError when the server does not answer) and assess them. Blocking I/O."""
    usage = shutil.disk_usage(store_dir)
    try:
        _, jsz = monitor("/jsz")
        status, health = monitor("/healthz")
    except OSError:
        return assess(path=store_dir, free_bytes=usage.free, total_bytes=usage.total, jsz=None, health_error=None,
                      reachable=False, reserved_bytes=reserved_bytes, recoveries=recoveries)
    error = None if status == 200 else str((health or {}).get("error") or (health or {}).get("status") or status)
    return assess(path=store_dir, free_bytes=usage.free, total_bytes=usage.total,
                  jsz=jsz if isinstance(jsz, dict) else None, health_error=error, reachable=True,
                  reserved_bytes=reserved_bytes, recoveries=recoveries)


def as_status(pressure: StorePressure | None) -> dict[str, Any] | None:
    """The `store` section of the status document."""
    return None if pressure is None else msgspec.to_builtins(pressure)
