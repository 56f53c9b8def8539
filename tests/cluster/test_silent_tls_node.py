"""A silent node of a 3-node TLS cluster costs its clients at most 5 s.

Each node runs in its own network namespace; the node a gateway and an agent identity are
connected to goes silent (every packet into and out of its namespace dropped, the process
running on). Core request/reply from the gateway to the agent (how inference travels) and
appends to an R3 stream whose leader is elsewhere must succeed again within 5 s. Before, the
clients noticed the silence by ping but then waited for a clean TLS shutdown that a silent peer
never answers (asyncio gives up after 30 s): about 40 s without service.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from grid.events.subjects import REQUESTS_STREAM, request_subject
from grid.identity.admin import sync_accounts
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.creds import connect_options, infer_connect_options
from grid.identity.permissions import Principal, Role, infer_subject_root
from grid.testfleet.nscluster import NamespacedTLSCluster
from grid.transport.jetstream import JetStreamLog

GOAL_SECONDS = 5.0
# How long to wait for service to come back at all (the stall being fixed was about 40 s).
GIVE_UP_SECONDS = 60.0
PROBE_TIMEOUT_SECONDS = 1.0


@pytest.fixture
def ns_cluster(tmp_path: Path) -> Iterator[NamespacedTLSCluster]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    cluster = NamespacedTLSCluster(tmp_path / "cluster", Authority(tmp_path / "identity"))
    cluster.start()
    try:
        yield cluster
    finally:
        assert cluster.stop() == []


class Probe:
    """Calls `attempt` back to back and records when each call succeeded."""

    def __init__(self, name: str, attempt: Callable[[], Awaitable[object]]) -> None:
        self.name, self.attempt = name, attempt
        self.successes: list[float] = []
        self.failures = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.attempt()
            except Exception:  # a timeout, no responders, a lost connection: all count as failures
                self.failures += 1
                await asyncio.sleep(0.05)
                continue
            self.successes.append(time.monotonic())
            await asyncio.sleep(0.05)

    def served_after(self, moment: float) -> int:
        return sum(1 for t in self.successes if t > moment)

    def outage(self, moment: float) -> float:
        """Seconds from the fault to the first success after it."""
        return min(t for t in self.successes if t > moment) - moment


async def test_clients_of_a_silent_tls_node_serve_again_within_5_seconds(
        ns_cluster: NamespacedTLSCluster, tmp_path: Path) -> None:
    authority, ca = ns_cluster.authority, ns_cluster.ca_cert
    controller = authority.issue_creds(Principal(Role.CONTROLLER), tmp_path / "c.creds", now=time.time(),
                                       ttl_seconds=3600)
    admin = await connect_log(ns_cluster.url, credentials=controller, tls_ca=ca)
    agent = gateway = inference = None
    try:
        info = await admin.client.jetstream().stream_info(REQUESTS_STREAM)
        assert info.cluster is not None and info.cluster.leader
        # The silent node is not the stream's leader: what is measured is the clients leaving
        # it, not JetStream electing a new leader.
        victim = next(i for i in range(3) if i != ns_cluster.index_of(info.cluster.leader))
        order = ",".join([ns_cluster.urls[victim]] + [u for i, u in enumerate(ns_cluster.urls) if i != victim])
        host_creds = authority.issue_creds(authority.host_principal("h1"), tmp_path / "h1.creds", now=time.time(),
                                           ttl_seconds=3600)
        await sync_accounts(authority, ns_cluster.url, tls_ca=ca)  # h1's own account
        gateway_creds = authority.issue_creds(Principal(Role.GATEWAY), tmp_path / "g.creds", now=time.time(),
                                              ttl_seconds=3600)
        agent = await JetStreamLog.connect(order, name="grid-agent", ensure_streams=False, timeout=1.0,
                                           nats_options={**connect_options(host_creds, ca), "dont_randomize": True})
        gateway = await JetStreamLog.connect(order, name="grid-gateway", ensure_streams=False,
                                             timeout=PROBE_TIMEOUT_SECONDS,
                                             nats_options={**connect_options(gateway_creds, ca),
                                                           "dont_randomize": True})
        # Inference goes out as the gateway's key in the INFER account (grid.identity.accounts).
        infer_options = infer_connect_options(gateway_creds, ca)
        assert infer_options is not None
        inference = await JetStreamLog.connect(order, name="grid-gateway-infer", ensure_streams=False,
                                               timeout=PROBE_TIMEOUT_SECONDS,
                                               nats_options={**infer_options, "dont_randomize": True})
        for client in (agent.client, gateway.client, inference.client):
            assert client.connected_url is not None
            assert client.connected_url.netloc == urlparse(ns_cluster.urls[victim]).netloc

        async def answer(msg) -> None:  # type: ignore[no-untyped-def]
            await msg.respond(b"ok")

        subject = f"{infer_subject_root('h1')}.probe"
        await agent.client.subscribe(subject, cb=answer)
        await agent.client.flush()
        ids = itertools.count()

        async def request() -> None:
            reply = await inference.client.request(subject, b"ping", timeout=PROBE_TIMEOUT_SECONDS)
            assert reply.data == b"ok"

        async def append() -> None:
            await gateway.append_raw(request_subject("completed"), b"{}", msg_id=f"probe-{next(ids)}")

        probes = [Probe("request/reply", request), Probe("append", append)]
        stop = asyncio.Event()
        running = asyncio.gather(*(p.run(stop) for p in probes))
        try:
            await wait_for(lambda: all(p.served_after(0) >= 10 for p in probes), 30, "steady service")
            ns_cluster.silence(victim)
            silenced_at = time.monotonic()
            await wait_for(lambda: all(p.served_after(silenced_at) >= 5 for p in probes), GIVE_UP_SECONDS,
                           "service after the node went silent")
        finally:
            stop.set()
            await running
        outages = {p.name: round(p.outage(silenced_at), 2) for p in probes}
        assert all(o <= GOAL_SECONDS for o in outages.values()), outages
        for client in (agent.client, gateway.client, inference.client):
            assert client.connected_url is not None
            assert client.connected_url.netloc != urlparse(ns_cluster.urls[victim]).netloc
    finally:
        for log in (agent, gateway, inference, admin):
            if log is not None:
                with contextlib.suppress(Exception):
                    await log.close()


async def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        await asyncio.sleep(0.05)
