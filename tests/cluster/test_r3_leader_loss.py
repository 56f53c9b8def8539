"""R3 streams on a secured 3-node cluster: SIGKILL the stream leader's node during a burst of
appends from an agent identity and the gateway identity. Every acknowledged append is in the
stream afterwards (count and ids, no duplicates), and appends go on under the new leader."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from grid.controller.ingress import INGRESS_POLICIES, HostIngress, IngressBudget
from grid.events.log import LogError
from grid.events.subjects import HOSTS_STREAM, REQUESTS_STREAM, host_subject, request_subject
from grid.identity.admin import sync_accounts
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.creds import connect_options
from grid.identity.permissions import Principal, Role
from grid.identity.server import SecuredNatsCluster
from grid.identity.signing import Identity
from grid.projections.budget import BudgetPolicy
from grid.identity.tls import TLSMaterial
from grid.transport.jetstream import JetStreamLog

PER_IDENTITY = 500  # 1,000 appends in all
IN_FLIGHT = 8


async def stream_leader(log: JetStreamLog, stream: str) -> str:
    info = await log.client.jetstream().stream_info(stream)
    assert info.cluster is not None and info.cluster.leader
    return info.cluster.leader


async def stored_ids(log: JetStreamLog, stream: str) -> list[str]:
    return [m.msg_id or "" async for m in log.replay(stream)]


class Burst:
    """Appends `count` messages with ids `<prefix>-<n>`, each retried with the same id until
    the stream acknowledges it (a retry of an append that did land is deduplicated)."""

    def __init__(self, log: JetStreamLog, subject: str, prefix: str, count: int) -> None:
        self.log, self.subject, self.prefix, self.count = log, subject, prefix, count
        self.acked: dict[str, int] = {}
        self.acked_at: dict[str, float] = {}
        self.retries = 0

    async def one(self, n: int, deadline: float) -> None:
        msg_id = f"{self.prefix}-{n}"
        while True:
            try:
                ack = await self.log.append_raw(self.subject, f'{{"n":{n}}}'.encode(), msg_id=msg_id)
            except LogError:
                assert time.monotonic() < deadline, f"{msg_id} never acknowledged"
                self.retries += 1
                await asyncio.sleep(0.1)
                continue
            self.acked[msg_id] = ack.seq
            self.acked_at[msg_id] = time.monotonic()
            return

    async def run(self, deadline: float) -> None:
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def guarded(n: int) -> None:
            async with gate:
                await self.one(n, deadline)

        await asyncio.gather(*(guarded(n) for n in range(self.count)))


async def test_killing_the_stream_leader_mid_burst_loses_no_acknowledged_append(
        secured_cluster: SecuredNatsCluster, authority: Authority, cluster_tls: TLSMaterial, tmp_path: Path) -> None:
    ca = cluster_tls.ca_cert
    controller = authority.issue_creds(Principal(Role.CONTROLLER), tmp_path / "c.creds", now=time.time(),
                                       ttl_seconds=3600)
    admin = await connect_log(secured_cluster.url, credentials=controller, tls_ca=ca)
    try:
        info = {k: admin.client._server_info.get(k) for k in ("server_name", "cluster", "connect_urls")}
        assert {r.actual for r in admin.replica_reports} == {3}, info
        leader = await stream_leader(admin, HOSTS_STREAM)
        victim = secured_cluster.index_of(leader)
        # The agent and the gateway are connected to the leader's node first (no shuffling), so
        # the kill takes their connection as well as the stream leader.
        order = [secured_cluster.urls[victim]] + [u for i, u in enumerate(secured_cluster.urls) if i != victim]
        host_creds = authority.issue_creds(authority.host_principal("h1"), tmp_path / "h1.creds", now=time.time(),
                                           ttl_seconds=3600)
        await sync_accounts(authority, secured_cluster.url, tls_ca=ca)  # h1's own account
        gateway_creds = authority.issue_creds(Principal(Role.GATEWAY), tmp_path / "g.creds", now=time.time(),
                                              ttl_seconds=3600)
        agent = await JetStreamLog.connect(",".join(order), name="grid-agent", ensure_streams=False, timeout=2.0,
                                           nats_options={**connect_options(host_creds, ca), "dont_randomize": True})
        # A host's appends are signed and stored through a controller's ingress (here on the
        # admin's connection, wherever that is): the kill may take it too, and it comes back.
        # Its budgets are opened wide: this burst is about the stream, not the host's rate.
        agent.authorship = Identity.from_creds(host_creds)
        wide = BudgetPolicy(rate_per_second=10_000, burst_messages=10_000)
        ingress = HostIngress(IngressBudget({kind: wide for kind in INGRESS_POLICIES}))
        await ingress.start(admin.client)
        gateway = await JetStreamLog.connect(",".join(order), name="grid-gateway", ensure_streams=False, timeout=2.0,
                                             nats_options={**connect_options(gateway_creds, ca),
                                                           "dont_randomize": True})
        try:
            bursts = [Burst(agent, host_subject("h1", "heartbeat"), "hb", PER_IDENTITY),
                      Burst(gateway, request_subject("completed"), "req", PER_IDENTITY)]
            deadline = time.monotonic() + 120
            running = asyncio.gather(*(b.run(deadline) for b in bursts))
            while sum(len(b.acked) for b in bursts) < 300:
                await asyncio.sleep(0.01)
            secured_cluster.kill(victim)
            killed_at = time.monotonic()
            await running
            # Appends went on after the kill, under a new leader.
            assert all(any(at > killed_at for at in b.acked_at.values()) for b in bursts)
            new_leader = await stream_leader(admin, HOSTS_STREAM)
            assert new_leader != leader
            for burst, stream in zip(bursts, (HOSTS_STREAM, REQUESTS_STREAM), strict=True):
                # The ingress stores a host's message id under its host token.
                ids = [i.removeprefix("h1:") for i in await stored_ids(admin, stream)]
                assert len(ids) == PER_IDENTITY == len(set(ids))  # every acknowledged one, once
                assert set(ids) == set(burst.acked)
            # And the system keeps appending.
            await agent.append_raw(host_subject("h1", "heartbeat"), b"{}", msg_id="after")
            await gateway.append_raw(request_subject("completed"), b"{}", msg_id="after")
            # The killed node comes back and catches up by itself.
            secured_cluster.restart(victim)
            secured_cluster.wait_jetstream(30, nodes=[victim])
        finally:
            await ingress.stop()
            await agent.close()
            await gateway.close()
    finally:
        await admin.close()
