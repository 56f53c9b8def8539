"""What the controller sets up on the log for an identity that may not set it up itself."""

from __future__ import annotations

from grid.events.log import EventLog
from grid.events.subjects import COMMANDS_STREAM, command_subject
from grid.identity.permissions import host_consumer


async def provision_host_consumer(log: EventLog, host_id: str) -> None:
    """Create (idempotently) the durable consumer `host_id`'s agent reads its commands from.

    Created through the same `subscribe` call the agent makes, so the configuration is exactly
    the one the agent would have created; the host itself may only look it up, fetch and ack.
    """
    sub = await log.subscribe(COMMANDS_STREAM, durable=host_consumer(host_id), subject_filter=command_subject(host_id))
    await sub.close()
