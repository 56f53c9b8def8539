"""Metrics families render as valid Prometheus exposition and read state at scrape time."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from grid.events.requests import RequestFeatures
from grid.metrics import AgentMetrics, ControllerMetrics, GatewayMetrics, GaugeSource, counts, exposition
from tests import heartbeats


def parse(data: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(data.decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_gateway_request_observations() -> None:
    live = {"ready": 2}
    m = GatewayMetrics([GaugeSource("grid_gateway_routes", "Routes by state.", ("state",),
                                    lambda: counts([s for s, n in live.items() for _ in range(n)], ("ready", "draining")))])
    f = RequestFeatures(endpoint="chat", requested_model="m", served_model="m", service_seconds=0.3, status_code=200,
                        input_units=12, output_units=40, host_id="h1")
    m.record_request(f, ttft_seconds=0.05)
    m.record_request(RequestFeatures(endpoint="chat", requested_model="m", status_code=503, outcome="unavailable"))
    got = parse(exposition(m.registry))
    # Each request series names the host that served it; "" when none did (refused before routing).
    assert ({"model": "m", "endpoint": "chat", "status": "200", "host": "h1"}, 1.0) in got["grid_gateway_requests_total"]
    assert ({"model": "m", "endpoint": "chat", "status": "503", "host": ""}, 1.0) in got["grid_gateway_requests_total"]
    assert ({"model": "m", "direction": "output", "host": "h1"}, 40.0) in got["grid_gateway_tokens_total"]
    assert ({"model": "m", "host": "h1"}, 1.0) in got["grid_gateway_time_to_first_token_seconds_count"]
    assert ({"model": "m", "endpoint": "chat", "host": "h1"}, 1.0) in got["grid_gateway_request_seconds_count"]
    assert sorted(got["grid_gateway_routes"], key=str) == [({"state": "draining"}, 0.0), ({"state": "ready"}, 2.0)]
    live["ready"] = 5  # a state gauge reads the component at scrape time
    assert ({"state": "ready"}, 5.0) in parse(exposition(m.registry))["grid_gateway_routes"]


def test_host_gauges_read_the_fleet_at_scrape_time() -> None:
    from grid.events.host import HostResources, Residency
    from grid.gateway.host_metrics import host_gauges
    from grid.projections.fleet import FleetState, HostRecord

    def record(host: str, at: float, *residencies: Residency, unmanaged: int = 0) -> HostRecord:
        resources = HostResources(capacity_mb=8000, reserved_mb=1000)
        hb = heartbeats.heartbeat(host, *residencies, event_id=f"hb-{host}", at=at, resources=resources,
                                  unmanaged_memory_mb=unmanaged)
        return HostRecord(host_id=host, resources=resources, heartbeat=hb, heartbeat_at=at)

    fleet = FleetState(hosts={
        "h2": record("h2", 90.0),
        "h1": record("h1", 95.0, Residency(model_id="a", memory_mb=700, state="ready"),
                     Residency(model_id="b", memory_mb=300, state="ready"),
                     Residency(model_id="c", memory_mb=200, state="cached"), unmanaged=50),
    })
    clock = {"now": 100.0}
    m = GatewayMetrics(host_gauges(lambda: fleet, lambda: clock["now"]))
    got = parse(exposition(m.registry))
    assert got["grid_gateway_host_heartbeat_age_seconds"] == [({"host": "h1"}, 5.0), ({"host": "h2"}, 10.0)]
    assert got["grid_gateway_host_capacity_mb"] == [({"host": "h1"}, 7000.0), ({"host": "h2"}, 7000.0)]
    memory = {(s["host"], s["state"]): v for s, v in got["grid_gateway_host_memory_mb"]}
    assert memory[("h1", "ready")] == 1000.0 and memory[("h1", "cached")] == 200.0
    assert memory[("h1", "unmanaged")] == 50.0 and memory[("h2", "ready")] == 0.0
    assert {state for _h, state in memory} == {"cached", "loading", "warming", "ready", "draining", "unloading",
                                               "failed", "unmanaged"}
    clock["now"] = 130.0
    assert ({"host": "h2"}, 40.0) in parse(exposition(m.registry))["grid_gateway_host_heartbeat_age_seconds"]


def test_controller_and_agent_families() -> None:
    c = ControllerMetrics([GaugeSource("grid_controller_lease_term", "Term.", (), lambda: [((), 7.0)])])
    c.tick.observe(0.02)
    c.commands.labels("load").inc()
    got = parse(exposition(c.registry))
    assert got["grid_controller_lease_term"] == [({}, 7.0)]
    assert got["grid_controller_tick_seconds_count"] == [({}, 1.0)]
    a = AgentMetrics([GaugeSource("grid_agent_residencies", "By state.", ("state",), lambda: counts(["ready", "ready", "loading"]))])
    a.actions.labels("load", "succeeded").observe(4.2)
    got = parse(exposition(a.registry))
    assert sorted(got["grid_agent_residencies"], key=str) == [({"state": "loading"}, 1.0), ({"state": "ready"}, 2.0)]
    assert ({"kind": "load", "status": "succeeded"}, 1.0) in got["grid_agent_action_seconds_count"]


def test_registries_are_per_process_component() -> None:
    a, b = GatewayMetrics(), GatewayMetrics()
    a.record_request(RequestFeatures(endpoint="chat", requested_model="x"))
    assert parse(exposition(b.registry)).get("grid_gateway_requests_total", []) == []
    assert len(parse(exposition(a.registry))["grid_gateway_requests_total"]) == 1


def test_rejected_events_is_one_counter_family_read_at_scrape_time() -> None:
    from grid.events.authorship import HEARTBEAT_REJECTION_REASONS
    from grid.identity.provenance import SUBJECT_MISMATCH
    from grid.identity.signing import REJECTION_REASONS
    from grid.metrics import REJECTION_VOCABULARY, rejected_events

    live: dict[str, int] = {}
    families = [GatewayMetrics([rejected_events(lambda: live)]), ControllerMetrics([rejected_events(lambda: live)]),
                AgentMetrics([rejected_events(lambda: live)])]
    for m in families:
        (family,) = [f for f in text_string_to_metric_families(exposition(m.registry).decode())
                     if f.name == "grid_events_rejected"]
        assert family.type == "counter"
        # Every reason is exposed, zero included: an alert can match reason="revoked_signer" > 0.
        assert sorted((s.labels["reason"], s.value) for s in family.samples) == [(r, 0.0) for r in
                                                                                  sorted(REJECTION_VOCABULARY)]
    assert set(REJECTION_VOCABULARY) == {*REJECTION_REASONS, SUBJECT_MISMATCH, *HEARTBEAT_REJECTION_REASONS}
    live.update({"unsigned": 2, SUBJECT_MISMATCH: 1})
    got = parse(exposition(families[0].registry))["grid_events_rejected_total"]
    assert ({"reason": "unsigned"}, 2.0) in got and ({"reason": SUBJECT_MISMATCH}, 1.0) in got
    assert ({"reason": "bad_signature"}, 0.0) in got


def test_the_agent_exposes_its_unproven_commands() -> None:
    from grid.agent.http import agent_metrics
    from grid.agent.protection import ProtectionStatus
    from grid.agent.state import AgentState

    unproven = {"bad_signature": 1}
    got = parse(exposition(agent_metrics(AgentState, ProtectionStatus, lambda: unproven).registry))
    assert ({"reason": "bad_signature"}, 1.0) in got["grid_events_rejected_total"]
    assert ({"reason": "unsigned"}, 0.0) in got["grid_events_rejected_total"]


def test_the_agent_exposes_its_responders_counts() -> None:
    """Served, health checks by result, stalled answers and refusals by reason, read from the
    live responder at scrape time; nothing before it starts."""
    from types import SimpleNamespace

    from grid.agent.http import REFUSED_ENGINE_STALLED, agent_metrics
    from grid.agent.protection import ProtectionStatus
    from grid.agent.state import AgentState

    live: list[object] = []
    registry = agent_metrics(AgentState, ProtectionStatus, dict, lambda: live[0] if live else None).registry
    assert "grid_agent_inference_served_total" not in parse(exposition(registry))
    live.append(SimpleNamespace(served=7, health_probes=5, health_probes_unanswered=3, stalled_answers=1,
                                refused={"not_served_here": 2}, refused_stalled=4))
    got = parse(exposition(registry))
    assert got["grid_agent_inference_served_total"] == [({}, 7.0)]
    assert sorted(got["grid_agent_engine_health_checks_total"], key=str) == sorted(
        [({"result": "answered"}, 2.0), ({"result": "unanswered"}, 3.0)], key=str)
    assert got["grid_agent_inference_stalled_total"] == [({}, 1.0)]
    assert sorted(got["grid_agent_inference_refused_total"], key=str) == sorted(
        [({"reason": "not_served_here"}, 2.0), ({"reason": REFUSED_ENGINE_STALLED}, 4.0)], key=str)


async def test_the_gateway_counts_what_its_runner_rejects(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A gateway reading a signed log: an unsigned heartbeat, and a host's heartbeat naming
    another host, reach neither its routes nor its hosts, and show on /metrics and in its stats."""
    import time

    from grid.clock import SimulatedClock
    from grid.config import GridConfig
    from grid.events import codec
    from grid.events.host import HostHeartbeat
    from grid.events.log import InMemoryLog
    from grid.events.subjects import host_subject
    from grid.gateway.state import Gateway
    from tests.identities import Identities

    ids = Identities(tmp_path / "grid")
    clock = SimulatedClock(time.time())
    log = InMemoryLog(clock)

    def hb(host: str) -> HostHeartbeat:
        return heartbeats.heartbeat(host, event_id=f"hb-{host}-{clock.now()}", at=clock.now(), capacity_mb=8000)

    log.authorship = ids.host("h1")
    await log.append(hb("h1"))
    await log.append_raw(host_subject("h1", "heartbeat"), codec.encode(hb("h2")))
    log.authorship = None
    await log.append(hb("h3"))
    log.authorship = ids.gateway  # the gateway's own identity: what it verifies with
    gw = Gateway(log, GridConfig(home=tmp_path / "home", nats_url=None), api_keys=[], clock=clock)
    await gw.start()
    try:
        assert sorted(gw.runner["fleet"].hosts) == ["h1"]
        assert gw.stats()["projection"]["rejected"] == {"subject_mismatch": 1, "unsigned": 1}
        got = parse(exposition(gw.metrics.registry))["grid_events_rejected_total"]
        assert ({"reason": "subject_mismatch"}, 1.0) in got and ({"reason": "unsigned"}, 1.0) in got
    finally:
        await gw.stop()
