"""The gateway's /metrics: scraped from the real server after real requests through a real
llama-server, parsed as Prometheus exposition."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import MODEL, Engine, GatewayFactory, ready

pytestmark = pytest.mark.slow


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_gateway_metrics_scrape(make_gateway: GatewayFactory, engines: dict[str, Engine]) -> None:
    gw = await make_gateway(api_keys=["metrics-key"])
    a = engines["host-a"]
    await gw.heartbeat("host-a", ready(a.endpoint), ready(a.endpoint, model="warming-one", state="warming"))
    messages = [{"role": "user", "content": "Say hi."}]
    await gw.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)  # type: ignore[arg-type]
    stream = await gw.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4,  # type: ignore[arg-type]
                                                     stream=True)
    async for _ in stream:
        pass
    # a model with no ready replica: counted with its 503
    with pytest.raises(Exception):
        await gw.client.chat.completions.create(model="warming-one", messages=messages, max_tokens=2)  # type: ignore[arg-type]

    # /metrics names models: behind the client key like /gateway/stats
    assert (await gw.http.get("/metrics")).status_code == 401
    r = await gw.http.get("/metrics", headers=gw.auth_headers())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = parse(r.text)
    # Request series name the host that served them; a request no host served has host="".
    served = (("endpoint", "chat"), ("host", "host-a"), ("model", MODEL))
    assert m[("grid_gateway_requests_total", (*served, ("status", "200")))] == 2
    assert m[("grid_gateway_requests_total", (("endpoint", "chat"), ("host", ""), ("model", "warming-one"),
                                              ("status", "503")))] == 1
    assert m[("grid_gateway_request_seconds_count", served)] == 2
    assert m[("grid_gateway_time_to_first_token_seconds_count", (("host", "host-a"), ("model", MODEL)))] == 1
    assert m[("grid_gateway_tokens_total", (("direction", "output"), ("host", "host-a"), ("model", MODEL)))] > 0
    assert m[("grid_gateway_in_flight", (("host", "host-a"), ("model", MODEL)))] == 0
    # The fleet as the gateway routes with it: heartbeat age and memory per host.
    assert 0 <= m[("grid_gateway_host_heartbeat_age_seconds", (("host", "host-a"),))] < 30
    assert m[("grid_gateway_host_capacity_mb", (("host", "host-a"),))] == 16000
    assert m[("grid_gateway_host_memory_mb", (("host", "host-a"), ("state", "ready")))] == 300
    assert m[("grid_gateway_host_memory_mb", (("host", "host-a"), ("state", "warming")))] == 300
    assert m[("grid_gateway_host_memory_mb", (("host", "host-a"), ("state", "unmanaged")))] == 0
    assert m[("grid_gateway_routes", (("state", "ready"),))] == 1
    assert m[("grid_gateway_routes", (("state", "warming"),))] == 1
    # every state is exposed (zero included); healthy routes have no open circuit
    assert ("grid_gateway_breakers", (("state", "closed"),)) in m
    assert m[("grid_gateway_breakers", (("state", "open"),))] == 0
    assert m[("grid_gateway_telemetry_dropped_total", ())] == 0
    # no key, prompt or engine secret ever appears in the exposition
    for secret in ("Say hi", "metrics-key", a.key):
        assert secret not in r.text
    async with httpx.AsyncClient(base_url=gw.url) as plain:
        assert (await plain.get("/metrics", headers={"Authorization": "Bearer wrong"})).status_code == 401
