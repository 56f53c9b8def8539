"""Acknowledgements an agent appends for each command it received."""

from __future__ import annotations

from typing import Literal

from grid.events.base import Event

AckStatus = Literal["accepted", "succeeded", "failed", "rejected", "cancelled"]
TERMINAL_ACK_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "rejected", "cancelled"})


class ActionAck(Event, frozen=True, kw_only=True, tag="host.ack.v1"):
    host_id: str
    action_id: str
    status: AckStatus
    message: str = ""
    duration_seconds: float | None = None
    # True only when a load really fetched the artifact (never for verification or cache hits).
    artifact_fetched: bool = False
    kind: str = ""
    model_id: str = ""
    generation: str = ""
    controller_term: int = 0
