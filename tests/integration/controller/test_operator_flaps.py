"""Operator drains and resumes do not put a host into flap quarantine.

A real agent process (`gridctl node start`) on the real log, a real controller, and the
operator's `gridctl host drain` / `gridctl host resume` four times over (eight state changes, more
than the six in 30 minutes that quarantine a flapping host). The agent honours each override and
reports it (its protection transition says `override`; the release leaves the state the override
made); the controller's flap evidence counts none of them, so the host is not quarantined.
"""

from __future__ import annotations

import signal
from pathlib import Path

from grid.events.host import HostHeartbeat, ProtectionTransition
from grid.fleet.planning import Policy
from grid.projections import lifecycle as lifecycle_proj
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog

from tests.faults.agentproc import spawn_agent
from tests.integration.agent.agentkit import host_events, wait_for
from tests.integration.controller.statuskit import serving_controller, status_until
from tests.integration.controller.test_cli_admin import gridctl
from tests.ports import engine_ports_arg

HOST = "h-operated"
CYCLES = 4


async def _latest_state(log: JetStreamLog) -> str | None:
    beats = [e for e in await host_events(log) if isinstance(e, HostHeartbeat) and e.host_id == HOST]
    return beats[-1].state if beats else None


async def _host_caused(log: JetStreamLog) -> int:
    """Transitions the host made itself (its sensors), by its own account."""
    made_by_operator: str | None = None
    n = 0
    for e in await host_events(log):
        if not isinstance(e, ProtectionTransition) or e.host_id != HOST:
            continue
        if e.override or e.from_state == made_by_operator:
            made_by_operator = e.to_state if e.override else None
            continue
        n += 1
    return n


async def test_operator_drains_and_resumes_are_no_flaps(js_log: JetStreamLog, nats_server: EmbeddedNats,
                                                        tmp_path: Path) -> None:
    assert 2 * CYCLES >= Policy().flap_host_transitions
    agent = spawn_agent(nats_server.url, tmp_path / "agent-home", tmp_path / "agent.log",
                        "--host-id", HOST, "--port-range", engine_ports_arg())
    home = tmp_path / "home"
    try:
        await wait_for(lambda: _latest_state(js_log), timeout=90.0, interval=0.3)
        async with serving_controller(js_log, home, "ctl-flaps") as ctl:
            for _ in range(CYCLES):
                # Released, the host returns to its own state (accepting, or throttled when this
                # shared machine's CPU is busy: the sensors' doing, which does count).
                for verb, draining in (("drain", True), ("resume", False)):
                    rc, _out, err = await gridctl(home, "host", verb, HOST, "--nats", nats_server.url)
                    assert rc == 0, err

                    async def shown(draining: bool = draining) -> bool:
                        return (await _latest_state(js_log) == "draining") == draining

                    await wait_for(shown, timeout=30.0, interval=0.2)

            async def nothing() -> None:
                return None

            doc = await status_until(home, nothing, lambda d: any(h["host_id"] == HOST and h["state"] != "draining"
                                                                  for h in d["hosts"]), "the drain released")
            lifecycle = ctl.view().states["lifecycle"]
            counted = lifecycle_proj.host_transitions(lifecycle).get(HOST, ())
            own = await _host_caused(js_log)
            assert len(counted) <= own, (counted, own)  # none of the operator's eight
            if own < Policy().flap_host_transitions:
                assert not [q for q in doc["flap_quarantines"] if q["subject"] == HOST], doc["flap_quarantines"]
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=30)
        except Exception:
            agent.kill()
            agent.wait(timeout=10)
