"""Metrics families render as valid Prometheus exposition and read state at scrape time."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from grid.events.requests import RequestFeatures
from grid.metrics import AgentMetrics, ControllerMetrics, GatewayMetrics, GaugeSource, counts, exposition


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
                        input_units=12, output_units=40)
    m.observe(f, ttft_seconds=0.05)
    m.observe(RequestFeatures(endpoint="chat", requested_model="m", status_code=503, outcome="unavailable"))
    got = parse(exposition(m.registry))
    assert ({"model": "m", "endpoint": "chat", "status": "200"}, 1.0) in got["grid_gateway_requests_total"]
    assert ({"model": "m", "endpoint": "chat", "status": "503"}, 1.0) in got["grid_gateway_requests_total"]
    assert ({"model": "m", "direction": "output"}, 40.0) in got["grid_gateway_tokens_total"]
    assert ({"model": "m"}, 1.0) in got["grid_gateway_time_to_first_token_seconds_count"]
    assert sorted(got["grid_gateway_routes"], key=str) == [({"state": "draining"}, 0.0), ({"state": "ready"}, 2.0)]
    live["ready"] = 5  # a state gauge reads the component at scrape time
    assert ({"state": "ready"}, 5.0) in parse(exposition(m.registry))["grid_gateway_routes"]


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
    a.observe(RequestFeatures(endpoint="chat", requested_model="x"))
    assert parse(exposition(b.registry)).get("grid_gateway_requests_total", []) == []
    assert len(parse(exposition(a.registry))["grid_gateway_requests_total"]) == 1
