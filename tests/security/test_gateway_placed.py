"""With auth on, the gateway routes a managed model only to what the signed plan placed and the
host's own signed warm ack confirmed; an enrolled host's claim (and its own ack) attracts nothing.

Real nats-server in operator mode, every process on its own credential (controller, gateway,
two hosts), so every event is signed and verified. The gateway starts after many heartbeats:
its hosts-stream tail holds none of the acks, which it scans for with its own credential (a
filtered consumer on GRID_HOSTS: its read permission suffices, no GRID_CMDS access).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from grid.config import GridConfig
from grid.events.base import new_event_id
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.events.subjects import HOSTS_STREAM
from grid.gateway import routing
from grid.gateway import state as gateway_state
from grid.identity.connect import connect_log
from grid.identity.permissions import Role
from grid.transport.jetstream import JetStreamLog
from tests.placement import Placements, warm_ack
from tests.security.conftest import CredsFactory, SecuredNats

MODEL = "smollm2"
SHA = "ab" * 32


def heartbeat(host: str) -> HostHeartbeat:
    claim = Residency(model_id=MODEL, memory_mb=300, state="ready", endpoint=f"http://{host}:1", max_concurrency=4,
                      artifact_sha256=SHA)
    return HostHeartbeat(event_id=new_event_id(), at=time.time(), host_id=host,
                         resources=HostResources(capacity_mb=16000), residencies=(claim,))


async def test_only_the_placed_and_acked_host_is_routed_under_auth(
        secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    hosts: dict[str, JetStreamLog] = {}
    gw = None
    try:
        for host in ("node-1", "node-2"):
            hosts[host] = await connect_log(secured_server.url, name=f"grid-agent-{host}",
                                            credentials=creds(Role.HOST, host_id=host), ensure_streams=False)
        placements = Placements(controller_log, ack_log=lambda h: hosts[h])
        await placements.place("node-1", MODEL)  # signed plan (controller), signed warm ack (node-1)
        # node-2 acks a warm of its own that no command asked for, and claims the model ready.
        await hosts["node-2"].append(warm_ack("node-2", MODEL))
        for _ in range(10):
            for host, log in hosts.items():
                await log.append(heartbeat(host))

        monkeypatch.setattr(gateway_state, "HOST_REPLAY_MAX_MESSAGES", 4)
        monkeypatch.setattr(gateway_state, "ACK_SCAN_IDLE_SECONDS", 2.0)
        gateway_log = await connect_log(secured_server.url, name="grid-gateway", credentials=creds(Role.GATEWAY),
                                        ensure_streams=False)
        gw = gateway_state.Gateway(gateway_log, GridConfig(home=tmp_path, nats_url=None), api_keys=[])
        await gw.start()
        assert gw.runner.gate.authorship is not None  # verifying signatures
        assert gw.ack_scan["folded"] == 2 and gw.ack_scan["to"] == await controller_log.last_sequence(HOSTS_STREAM) - 4
        now = time.time()
        routed = {c.host_id: routing.exclusion(c, now) for c in gw.table(now)[MODEL]}
        assert routed == {"node-1": None, "node-2": routing.EXCLUDED_UNPLACED}
        assert [(c.host_id, c.reason) for c in gw.unplaced_claims(now)] == [("node-2", "not_in_plan")]
        assert gw.runner.rejected == {}
    finally:
        if gw is not None:
            await gw.stop()
            await gw.log.close()
        for log in hosts.values():
            await log.close()
