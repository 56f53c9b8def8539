"""Subscriptions whose messages are handed over as nats-py's reader parses them.

A callback subscription makes nats-py queue each message and hand it over from a task of its
own: a queue and a task switch per message on the inference path (each reply message on the
gateway, each request on the agent). Where the client's internals allow it, `subscribe` puts a
direct hand-off (`_Direct`) in place of the subscription's queue and no such task exists;
otherwise it falls back to an ordinary callback subscription. `deliver` must not block: it
runs inside the connection's reader.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import structlog
from nats.aio.client import Client as NATS

log = structlog.get_logger(__name__)


class _Direct:
    """Stands in for a subscription's pending queue. Empty to anyone asking, so unsubscribing
    or draining the connection waits for nothing."""

    __slots__ = ("_deliver",)

    def __init__(self, deliver: Callable[[Any], None]) -> None:
        self._deliver = deliver

    def put_nowait(self, msg: Any) -> None:
        try:
            self._deliver(msg)
        except Exception as exc:  # never into the connection's reader, which would stop reading
            log.error("infer.delivery_failed", subject=msg.subject, error=type(exc).__name__)

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        pass

    async def join(self) -> None:
        return None


async def subscribe(nc: NATS, subject: str, deliver: Callable[[Any], None]) -> Any:
    sub = await nc.subscribe(subject)  # no callback: nats-py starts no task for it
    if isinstance(getattr(sub, "_pending_queue", None), asyncio.Queue) and hasattr(sub, "_pending_bytes_limit"):
        sub._pending_queue = _Direct(deliver)
        # Nothing is ever pending in it (the receiver bounds its own queues): no slow-consumer count.
        sub._pending_bytes_limit = 0
        return sub
    with contextlib.suppress(Exception):
        await sub.unsubscribe()

    async def cb(msg: Any) -> None:
        deliver(msg)

    return await nc.subscribe(subject, cb=cb)
