"""The event log store in status where the controller cannot measure the disk itself.

Beside the server it runs (`gridctl up`), the supervisor reads the store's filesystem and the
server's monitor (grid.transport.store_pressure). A controller connected to remote servers (a
cluster, or any server it did not start) sees no disk; what it can know comes from JetStream
itself: the account's storage in use, what its streams reserve and the account's storage limit
(`$JS.API.INFO`). That reading is named by its `source`, and every field it cannot know is None
with a `reason` that says why, never a bare null.

Pure: a function of the account-info document (or the error reading it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grid.transport.store_pressure import MIB, STORE_LOW_SPACE, STORE_OK, STORE_UNKNOWN, warn_free_bytes

# Where a store reading came from (the `source` of status's `store`).
SOURCE_LOCAL = "local_server_disk"  # the supervisor of the server beside the controller
SOURCE_ACCOUNT = "jetstream_account_info"  # $JS.API.INFO over the log's own connection
SOURCE_NONE = "none"

# Why the disk fields of an account reading are empty.
REASON_REMOTE_DISKS = ("the NATS servers run elsewhere: their disks are not visible to the controller; "
                       "storage and reservations are the JetStream account's ($JS.API.INFO)")
REASON_NO_LIMIT = "the account has no JetStream storage limit, so there is no headroom to measure against"


def _row(state: str, detail: str, source: str, reason: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "state": state, "detail": detail, "source": source, "reason": reason, "path": None,
        "free_bytes": None, "total_bytes": None, "warn_free_bytes": None, "jetstream_storage_bytes": None,
        "jetstream_reserved_bytes": None, "jetstream_max_bytes": None, "restart_needs_free_bytes": None,
        "recoveries": 0,
    }
    row.update(fields)
    return row


def unmeasured(reason: str) -> dict[str, Any]:
    """No reading (yet): state unknown, and why."""
    return _row(STORE_UNKNOWN, "", SOURCE_NONE, reason)


def local(pressure: Mapping[str, Any]) -> dict[str, Any]:
    """The supervisor's reading of the local store, named as such."""
    return {**pressure, "source": SOURCE_LOCAL, "reason": ""}


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def account_store(info: Mapping[str, Any] | None, error: str | None = None) -> dict[str, Any]:
    """The store as the JetStream account sees it: storage used and reserved, and, when the account
    has a storage limit, how much of it is left (low_free_space below the same threshold the local
    disk warns at)."""
    if info is None or info.get("error"):
        err = (info or {}).get("error")
        why = error or (str(err.get("description") or err) if isinstance(err, dict) else str(err))
        return _row(STORE_UNKNOWN, f"JetStream account info unavailable: {why}"[:300], SOURCE_ACCOUNT,
                    "the account info request failed")
    storage = _int(info.get("storage"))
    reserved = _int(info.get("reserved_storage"))
    limit = _int((info.get("limits") or {}).get("max_storage"))
    common = {"jetstream_storage_bytes": storage, "jetstream_reserved_bytes": reserved}
    if limit is None or limit <= 0:
        return _row(STORE_OK, "", SOURCE_ACCOUNT, f"{REASON_REMOTE_DISKS}; {REASON_NO_LIMIT}", **common)
    free = max(0, limit - (storage or 0))
    warn = warn_free_bytes(limit)
    state, detail = STORE_OK, ""
    if free < warn:
        state = STORE_LOW_SPACE
        detail = (f"{free // MIB} MiB left of the account's {limit // MIB} MiB JetStream storage limit, below the "
                  f"warning threshold of {warn // MIB} MiB; when it runs out, heartbeats stop being stored and "
                  "hosts go stale")
    return _row(state, detail, SOURCE_ACCOUNT, REASON_REMOTE_DISKS, free_bytes=free, total_bytes=limit,
                warn_free_bytes=warn, jetstream_max_bytes=limit, **common)
