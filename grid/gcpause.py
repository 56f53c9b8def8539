"""Python's cyclic garbage collector paused around a pure computation that allocates heavily.

A plan, and the tick around it, allocate per host and per candidate; every so many allocations
the collector traverses every tracked object of the process (in a controller, also the whole
fleet's projections and the states a tick holds) and finds nothing to free, since what the
computation allocated is alive until it returns. At 10,000 hosts that was about a quarter of a
plan's CPU and more than half of the rest of a tick's. Reference counting still frees what the
computation drops; the next collection after it takes the rest.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the block. Turned back on only if it was on (a pause inside
    a pause, another thread's pause, or a caller that turned it off): nesting is safe."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


__all__ = ["collector_paused"]
