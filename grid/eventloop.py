"""The event loop of Grid's long-running processes: uvloop where it is installed.

The inference path (gateway -> NATS -> host agent -> engine and back) crosses two Python event
loops and four TLS reads or writes per request; uvloop's loop and its native TLS transport take
most of the Python out of each (see bench.remote_overhead). It is a declared dependency on the
platforms it supports; elsewhere, and under GRID_EVENT_LOOP=asyncio, the standard loop runs.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

ENV_VAR = "GRID_EVENT_LOOP"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None for the standard one."""
    if os.environ.get(ENV_VAR, "").strip().lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` on the loop `loop_factory()` names."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
