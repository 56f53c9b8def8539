"""kill -9 the nats-server under live subscriptions, start it again on the same port and store.

The log's own contract across a server restart: the client reconnects, ordered (projection)
subscriptions resume right after the last message they handed out, and a durable (command)
consumer keeps its acknowledged position: nothing acknowledged before the kill is lost or
delivered again, and what was delivered but not acknowledged comes back.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grid.events.base import new_event_id
from grid.events.control import ModeSet
from grid.events.subjects import CONTROL_STREAM
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog

pytestmark = pytest.mark.slow


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A server of our own: killing the session's server would break every other test."""
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def kill_and_restart(server: EmbeddedNats, down_seconds: float = 1.0) -> None:
    assert server.process is not None
    port = server.port
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(10)
    time.sleep(down_seconds)
    server.respawn()
    server.wait_ready()
    assert server.port == port


def client_connections(server: EmbeddedNats) -> int:
    return int(httpx.get(f"http://{server.host}:{server.monitor_port}/connz", timeout=2).json()["num_connections"])


def mode_event(i: int) -> ModeSet:
    return ModeSet(event_id=new_event_id(), at=float(i), mode="recommend" if i % 2 else "observe")


async def test_subscriptions_resume_after_kill_9(private_nats: EmbeddedNats) -> None:
    log = await JetStreamLog.connect(private_nats.url, name="faults-test")
    try:
        before = [await log.append(mode_event(i)) for i in range(6)]
        ordered = await log.subscribe(CONTROL_STREAM, start_seq=1)
        durable = await log.subscribe(CONTROL_STREAM, durable="faults-durable")
        seen_ordered = [(await ordered.next(5)).seq for _ in range(4)]  # type: ignore[union-attr]
        acked = []
        for _ in range(3):
            msg = await durable.next(5)
            assert msg is not None
            await durable.ack(msg)  # confirmed by the server before the kill
            acked.append(msg.seq)
        unacked = await durable.next(5)  # delivered, never acknowledged: must come back
        assert unacked is not None
        assert acked == [1, 2, 3] and unacked.seq == 4
        # The server writes a consumer's ack floor to its store about 100 ms after the ack (a
        # kill inside that window redelivers those messages: the agent's persisted receipts make
        # that harmless, see test_nats_grid_restart.py). Past it, an ack survives kill -9.
        await asyncio.sleep(0.5)

        await asyncio.to_thread(kill_and_restart, private_nats)

        deadline = time.monotonic() + 15
        while client_connections(private_nats) != 1:
            assert time.monotonic() < deadline, "the client never reconnected to the restarted server"
            await asyncio.sleep(0.1)
        after = [await log.append(mode_event(i)) for i in range(6, 9)]
        assert [r.seq for r in before + after] == list(range(1, 10)), "an acknowledged append was lost"

        # Ordered: everything after what it had handed out, each once, in order.
        rest: list[int] = []
        while len(rest) < 5:
            msg = await ordered.next(15)
            assert msg is not None, f"ordered subscription stalled after the restart at {seen_ordered + rest}"
            rest.append(msg.seq)
        assert seen_ordered + rest == list(range(1, 10))
        assert await ordered.next(0.5) is None

        # Durable: the unacknowledged message again, then the rest; no acknowledged one again.
        redelivered: list[int] = []
        deadline = time.monotonic() + 45  # an unacked message comes back after ack_wait at worst
        while len(redelivered) < 6 and time.monotonic() < deadline:
            msg = await durable.next(2)
            if msg is not None:
                redelivered.append(msg.seq)
                await durable.ack(msg)
        assert sorted(redelivered) == [4, 5, 6, 7, 8, 9], redelivered
        assert await durable.next(0.5) is None
        await ordered.close()
        await durable.close()
    finally:
        await log.close()



async def test_a_lost_durable_consumer_is_recreated(private_nats: EmbeddedNats) -> None:
    """A server whose store lost the consumer (here: deleted under us) gets it back on the next pull.

    Re-created from its configuration, it starts over: redelivery the agent's receipts absorb.
    """
    log = await JetStreamLog.connect(private_nats.url, name="faults-test")
    try:
        for i in range(3):
            await log.append(mode_event(i))
        durable = await log.subscribe(CONTROL_STREAM, durable="faults-lost")
        first = await durable.next(5)
        assert first is not None
        await durable.ack(first)
        await log.client.jetstream().delete_consumer(CONTROL_STREAM, "faults-lost")
        seen: list[int] = []
        deadline = time.monotonic() + 10
        while len(seen) < 3 and time.monotonic() < deadline:
            msg = await durable.next(1)
            if msg is not None:
                seen.append(msg.seq)
                await durable.ack(msg)
        assert seen[-2:] == [2, 3], seen
        await durable.close()
    finally:
        await log.close()
