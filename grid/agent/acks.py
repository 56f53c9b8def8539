"""The ActionAck events an agent appends, built purely from a command or a persisted receipt.

Ack event ids are derived from (host, action, phase), so a republished ack (after a restart or
a failed publish) is deduplicated by the log's Nats-Msg-Id.
"""

from __future__ import annotations

import uuid

from grid.agent.outcomes import MSG_STARTED
from grid.agent.state import Receipt
from grid.events.acks import ActionAck
from grid.events.commands import CommandIssued


def ack_event_id(host_id: str, action_id: str, phase: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"grid-ack:{host_id}:{action_id}:{phase}").hex


def accepted_ack(host_id: str, cmd: CommandIssued, at: float) -> ActionAck:
    """The non-terminal ack: the command passed fencing and its side effect starts now."""
    return ActionAck(
        event_id=ack_event_id(host_id, cmd.action_id, "accepted"), at=at,
        host_id=host_id, action_id=cmd.action_id, status="accepted", message=MSG_STARTED,
        kind=cmd.kind, model_id=cmd.model_id, generation=cmd.generation,
        controller_term=cmd.controller_term,
    )


def terminal_ack(host_id: str, receipt: Receipt, at: float) -> ActionAck:
    return ActionAck(
        event_id=ack_event_id(host_id, receipt.action_id, "terminal"),
        at=at,
        host_id=host_id,
        action_id=receipt.action_id,
        status=receipt.status,  # type: ignore[arg-type]
        message=receipt.message,
        duration_seconds=receipt.duration_seconds,
        artifact_fetched=receipt.artifact_fetched,
        kind=receipt.kind,
        model_id=receipt.model_id,
        generation=receipt.generation,
        controller_term=receipt.controller_term,
    )
