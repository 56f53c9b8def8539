"""Parametrise the contract suite over both EventLog implementations, and over both ways a
JetStreamLog reads: ordered consumers (the controller) and batched direct gets (every other
identity, from an account of its own: grid.transport.direct_reads)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from grid.clock import SystemClock
from grid.events.log import InMemoryLog
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog
from tests.conftest import reset_streams


@pytest.fixture(params=["memory", "jetstream", "jetstream-direct-gets"])
async def event_log(request: pytest.FixtureRequest, nats_server: EmbeddedNats) -> AsyncIterator[object]:
    if request.param == "memory":
        yield InMemoryLog(SystemClock())
        return
    log = await JetStreamLog.connect(nats_server.url)
    log.direct_reads = request.param == "jetstream-direct-gets"
    await reset_streams(log)
    try:
        yield log
    finally:
        await log.close()
