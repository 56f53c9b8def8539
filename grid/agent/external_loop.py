"""The probe loop over the external engines registered on this host (grid.agent.external).

A round runs every PROBE_INTERVAL_SECONDS, and at once when `wake` is set (the responder's
engine client sets it when a forward to such an engine failed to connect), so a dead engine
leaves routing sooner. A round that changes what the heartbeat reports pokes the heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import httpx
import structlog

from grid.agent.external import PROBE_INTERVAL_SECONDS, ExternalEngines
from grid.clock import Clock

log = structlog.get_logger("grid.agent")


class ExternalProbes:
    def __init__(self, engines: ExternalEngines, clock: Clock, poke: Callable[[], None]) -> None:
        self.engines = engines
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._clock = clock
        self._poke = poke

    async def probe(self, http: httpx.AsyncClient | None) -> bool:
        """One round; True when what the heartbeat reports changed."""
        if http is None:
            return False
        try:
            return await self.engines.probe_all(http, self._clock.now())
        except Exception as exc:  # a damaged registry or a probe bug must not stop the agent
            log.warning("agent.external_probe_failed", error=type(exc).__name__)
            return False

    def start(self, http: httpx.AsyncClient | None) -> None:
        self.task = asyncio.create_task(self._run(http), name="agent-external")

    async def _run(self, http: httpx.AsyncClient | None) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=PROBE_INTERVAL_SECONDS)
            self.wake.clear()
            if await self.probe(http):
                self._poke()
