"""What the controller sets up on the log for an identity that may not set it up itself."""

from __future__ import annotations

from grid.events.log import EventLog
from grid.events.subjects import COMMANDS_STREAM, command_subject
from grid.identity.permissions import Principal


async def provision_host_consumer(log: EventLog, host: Principal) -> None:
    """Create (idempotently) the durable consumer a host's agent reads its commands from.

    Created through the same `subscribe` call the agent makes, so the configuration is exactly
    the one the agent would have created; the host itself may only look it up, fetch and ack.
    """
    if host.host_id is None or host.command_consumer is None:
        raise ValueError("only a host principal with its command consumer has commands to read")
    sub = await log.subscribe(COMMANDS_STREAM, durable=host.command_consumer,
                              subject_filter=command_subject(host.host_id))
    await sub.close()
