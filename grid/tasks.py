"""Ending background tasks for certain.

On Python 3.11, `asyncio.wait_for` returns its inner result instead of raising when a
cancellation lands in the same loop iteration as that result (3.12 fixed it). nats-py waits
for every request's reply with `wait_for`, so a task cancelled while it publishes can swallow
its one cancellation and run on, and a stop that awaits it never returns. Cancelling again
until the task has ended closes that gap.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

RECANCEL_SECONDS = 0.2


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any] | None]) -> None:
    """Cancel the tasks and return once every one has ended (their outcomes are dropped)."""
    every = [t for t in tasks if t is not None]
    pending = {t for t in every if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _done, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
    for t in every:
        if not t.cancelled():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                t.exception()  # retrieved, so asyncio does not report it as never retrieved
