"""A NATS node that stops answering (SIGSTOP: sockets open, nothing said) and comes back heals
without manual steps: clients on it fail over to another node within seconds, their live
consumers are re-created where they stood, and the node catches up when it resumes."""

from __future__ import annotations

import asyncio
import time

import httpx

from grid.events.log import LogError
from grid.events.subjects import HOSTS_STREAM, host_subject
from grid.transport.cluster import NatsCluster
from grid.transport.jetstream import JetStreamLog

# Two missed pings three seconds apart, a reconnect: the failover must come well within this.
FAILOVER_BUDGET_SECONDS = 25.0


async def append_until_acked(log: JetStreamLog, msg_id: str, deadline: float) -> float:
    while True:
        try:
            await log.append_raw(host_subject("h1", "heartbeat"), b"{}", msg_id=msg_id)
            return time.monotonic()
        except LogError:
            assert time.monotonic() < deadline, f"{msg_id} not acknowledged within the failover budget"
            await asyncio.sleep(0.1)


async def test_a_paused_node_fails_clients_over_and_heals_when_resumed(nats_cluster: NatsCluster) -> None:
    admin = await JetStreamLog.connect(nats_cluster.url)
    victim = 0
    order = ",".join(nats_cluster.urls)  # node 0 first, and no shuffling: the clients sit on it
    writer = await JetStreamLog.connect(order, ensure_streams=False, timeout=2.0, nats_options={"dont_randomize": True})
    reader = await JetStreamLog.connect(order, ensure_streams=False, timeout=2.0, nats_options={"dont_randomize": True})
    try:
        assert writer.client.connected_url is not None and writer.client.connected_url.port == nats_cluster.nodes[0].port
        sub = await reader.subscribe(HOSTS_STREAM, start_seq=1)
        durable = await reader.subscribe(HOSTS_STREAM, durable="pause-test")
        for n in range(20):
            await writer.append_raw(host_subject("h1", "heartbeat"), b"{}", msg_id=f"before-{n}")
        nats_cluster.pause(victim)
        paused_at = time.monotonic()
        try:
            acked_at = await append_until_acked(writer, "during-0", paused_at + FAILOVER_BUDGET_SECONDS)
            for n in range(1, 20):
                await append_until_acked(writer, f"during-{n}", time.monotonic() + 10)
            assert writer.client.connected_url.port != nats_cluster.nodes[0].port
            assert writer.reconnects >= 1 and acked_at - paused_at < FAILOVER_BUDGET_SECONDS
        finally:
            nats_cluster.resume(victim)
        # No manual step: the node answers again and its copy of the stream catches up.
        node = nats_cluster.nodes[victim]
        deadline = time.monotonic() + 30
        while True:
            jsz = httpx.get(f"http://{node.host}:{node.monitor_port}/jsz?streams=true", timeout=2.0).json()
            streams = {s["name"]: s for d in jsz.get("account_details", []) for s in d.get("stream_detail", [])}
            if streams.get(HOSTS_STREAM, {}).get("state", {}).get("last_seq") == 40:
                break
            assert time.monotonic() < deadline, f"paused node never caught up: {streams.get(HOSTS_STREAM)}"
            await asyncio.sleep(0.2)
        for n in range(5):
            await writer.append_raw(host_subject("h1", "heartbeat"), b"{}", msg_id=f"after-{n}")
        # The live consumers were re-created where they stood: every message, once, in order.
        seen = []
        while len(seen) < 45:
            msg = await sub.next(15.0)
            assert msg is not None, f"ordered consumer stalled after {len(seen)} messages"
            seen.append(msg.msg_id)
        expected = [f"before-{n}" for n in range(20)] + [f"during-{n}" for n in range(20)] + [f"after-{n}" for n in range(5)]
        assert seen == expected
        pulled = []
        while len(pulled) < 45:
            msg = await durable.next(15.0)
            assert msg is not None, f"durable consumer stalled after {len(pulled)} messages"
            pulled.append(msg.msg_id)
            await durable.ack(msg)
        assert sorted(pulled) == sorted(expected)
        await sub.close()
        await durable.close()
    finally:
        await writer.close()
        await reader.close()
        await admin.close()
