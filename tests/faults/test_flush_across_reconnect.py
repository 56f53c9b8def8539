"""A flush answers promptly across a reconnect, and a flush that timed out breaks nothing.

Against a real nats-server: a server that stops answering (SIGSTOP) leaves a flush waiting for
its PONG; the client declares the connection stale after its missed pings and reconnects to the
server started again on the same port. nats-py forgot the waiting PING at that moment, so the
flush waited out its whole timeout; `FailoverClient` sends it again once reconnected. And a PONG
arriving after its flush gave up used to raise in nats-py's read loop, which then dropped a
healthy connection.
"""

from __future__ import annotations

import asyncio
import signal
import time

import psutil
import pytest
from nats.errors import FlushTimeoutError

from grid.transport.embedded import EmbeddedNats
from grid.transport.nats_failover import connect_client
from tests.faults.test_nats_restart_log import private_nats  # noqa: F401 - fixture

pytestmark = pytest.mark.slow

FLUSH_TIMEOUT = 20.0


async def stop_server(server: EmbeddedNats) -> None:
    """SIGSTOP the server and wait until it is stopped (signal delivery is not synchronous)."""
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    proc = psutil.Process(server.process.pid)
    async with asyncio.timeout(10):
        while proc.status() != psutil.STATUS_STOPPED:
            await asyncio.sleep(0.01)


async def test_a_flush_waiting_when_the_connection_is_left_is_answered_by_the_next_one(
        private_nats: EmbeddedNats) -> None:
    reconnected = asyncio.Event()

    async def on_reconnect() -> None:
        reconnected.set()

    nc = await connect_client(servers=[private_nats.url], ping_interval=1, max_outstanding_pings=2,
                              reconnect_time_wait=0.2, max_reconnect_attempts=-1,
                              reconnected_cb=on_reconnect)
    try:
        assert private_nats.process is not None
        await stop_server(private_nats)  # silent: no PONG, no close
        flush = asyncio.create_task(nc.flush(timeout=FLUSH_TIMEOUT))
        await asyncio.sleep(0.2)
        assert not flush.done()
        private_nats.process.send_signal(signal.SIGKILL)
        private_nats.process.wait(10)
        private_nats.respawn()
        await asyncio.to_thread(private_nats.wait_ready)
        async with asyncio.timeout(FLUSH_TIMEOUT):
            await reconnected.wait()
        answered_after = time.monotonic()
        await asyncio.wait_for(flush, FLUSH_TIMEOUT)
        # Answered by the new connection's PONG, not by the flush's own timeout.
        assert time.monotonic() - answered_after < 5.0
        assert nc.is_connected and nc.stats["reconnects"] == 1
    finally:
        await nc.close()


async def test_a_pong_after_its_flush_gave_up_keeps_the_connection(private_nats: EmbeddedNats) -> None:
    errors: list[BaseException] = []

    async def on_error(exc: BaseException) -> None:
        errors.append(exc)

    nc = await connect_client(servers=[private_nats.url], ping_interval=60, max_outstanding_pings=2,
                              error_cb=on_error)
    try:
        assert private_nats.process is not None
        await stop_server(private_nats)
        with pytest.raises(FlushTimeoutError):
            await nc.flush(timeout=0.5)
        private_nats.process.send_signal(signal.SIGCONT)  # the late PONG arrives now
        await nc.flush(timeout=5)  # answered by its own PONG, after the late one
        await asyncio.sleep(0.2)
        assert nc.is_connected and nc.stats["reconnects"] == 0, errors
        assert not errors, errors
    finally:
        await nc.close()
