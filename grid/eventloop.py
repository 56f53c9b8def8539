"""The event loop of Grid's long-running processes: uvloop where it is installed.

The inference path (gateway -> NATS -> host agent -> engine and back) crosses two Python event
loops and four TLS reads or writes per request. uvloop's loop and TLS transport are native code:
bench.remote_overhead measured a tenth to a fifth less CPU per proxied request in the gateway
and in the agent, and about 0.3 ms less added latency. It is a declared dependency where it is
built (not on Windows); without it the standard loop runs.

GRID_EVENT_LOOP chooses explicitly: "uvloop" or "asyncio" (unset: uvloop if installed).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

ENV_VAR = "GRID_EVENT_LOOP"
CHOICES = ("uvloop", "asyncio")


class EventLoopChoiceError(ValueError):
    """GRID_EVENT_LOOP names no loop this machine can run."""


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None for the standard one."""
    wanted = os.environ.get(ENV_VAR, "").strip().lower()
    if wanted and wanted not in CHOICES:
        raise EventLoopChoiceError(f"{ENV_VAR}={wanted!r}: use one of {', '.join(CHOICES)} (or leave it unset)")
    if wanted == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if wanted == "uvloop":
            raise EventLoopChoiceError(f"{ENV_VAR}=uvloop, but uvloop is not installed here") from None
        return None
    return uvloop.new_event_loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` on the loop `loop_factory()` names."""
    try:
        factory = loop_factory()
    except EventLoopChoiceError:
        coro.close()  # never started: no "was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)
