"""The one heartbeat builder for tests: a host's report as its agent would sign and send it."""

from __future__ import annotations

import time
from typing import Any

from grid.events.base import new_event_id
from grid.events.host import HostHeartbeat, HostResources, Residency

CAPACITY_MB = 16_000


def heartbeat(host_id: str, *residencies: Residency, at: float | None = None, capacity_mb: int = CAPACITY_MB,
              resources: HostResources | None = None, event_id: str | None = None, **fields: Any) -> HostHeartbeat:
    """`host_id` reporting `residencies` at `at` (wall clock by default), with `capacity_mb` of
    memory unless `resources` says more; any other HostHeartbeat field passes through."""
    return HostHeartbeat(
        event_id=event_id or new_event_id(), at=time.time() if at is None else at, host_id=host_id,
        resources=resources or HostResources(capacity_mb=capacity_mb), residencies=residencies, **fields,
    )
