"""One attempt to serve a request on one route.

An attempt holds the route's concurrency slot (and, when the route's circuit is half-open, its
probe) from the moment the request is sent until the attempt is settled: finished (the request's
telemetry record written) once its outcome is known, which for a relayed stream or a plain 2xx
answer is only after the handler has returned the response, or released without a record when
the request provably reached no engine and goes on to another route. The slot is given back
exactly once, whichever way the attempt ends.
"""

from __future__ import annotations

import time
from typing import Protocol

from grid.gateway.routing import EXCLUDED_NO_RESPONDERS, EXCLUDED_SILENT, RouteCandidate
from grid.gateway.state import Gateway


class Recorder(Protocol):
    """Writes the request's one telemetry record."""

    def __call__(self, *, outcome: str, status: int, service: float, output_units: int = 0) -> None: ...


class Attempt:
    __slots__ = ("_gw", "_held", "_record", "route", "started")

    def __init__(self, gw: Gateway, route: RouteCandidate, now: float, record: Recorder) -> None:
        gw.breakers.acquire(route.key, now)
        gw.acquire(route.key, route.model_id, now)
        self._gw = gw
        self._record = record
        self._held = True
        self.route = route
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since the request was sent."""
        return time.perf_counter() - self.started

    def judge(self, breaker: str | None, excludes_host: str | None) -> float:
        """Tell the route's circuit breaker what the attempt showed (an OUTCOME_* constant, or None
        for nothing) and take the host out of routing until its next heartbeat when
        `excludes_host` says why (a routing EXCLUDED_* constant). Returns when, by the gateway's
        clock."""
        gw = self._gw
        route = self.route
        now = gw.clock.now()
        if breaker is not None:
            gw.breakers.record(route.key, breaker, now)
        if excludes_host == EXCLUDED_NO_RESPONDERS:
            # Until a heartbeat newer than the one this route was chosen with.
            gw.mark_no_responders(route.host_id, route.heartbeat_at, now)
        elif excludes_host == EXCLUDED_SILENT:
            gw.mark_silent(route.host_id, now)
        return now

    def release(self, now: float) -> None:
        """Give the route's slot back (the first call only)."""
        if self._held:
            self._held = False
            self._gw.release(self.route.key, self.route.model_id, now)

    def finish(self, outcome: str, status: int, service: float, output_units: int = 0) -> None:
        """Settle the attempt: its slot is given back, then the request's record is written."""
        self.release(self._gw.clock.now())
        self._record(outcome=outcome, status=status, service=service, output_units=output_units)
