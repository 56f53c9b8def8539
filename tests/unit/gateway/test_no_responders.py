""""No responders" (NATS proved the request reached nobody: the host's agent is gone) routes the
request again without that host, which stays unroutable until it heartbeats again.

A Gateway over the in-process log twin with two external replicas of one model (each admitted by
the operator), and an upstream
that answers for h1 and raises `NoResponders` for h2, as `grid.infer.client.NatsUpstream` does
when nobody subscribes to h2's inference subject. The real thing: tests/faults/test_gateway_no_responders.py.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from grid.gateway import routing
from grid.gateway.breaker import CLOSED
from grid.gateway.routes import build_routes, exception_handlers
from grid.infer.client import InferTarget, NoResponders
from grid.metrics import exposition
from tests.unit.gateway.test_placed_routing import Fleet, fleet, ready  # noqa: F401 - the fixture

CHAT = "/v1/chat/completions"
SSE = b'data: {"choices":[{"delta":{"content":"OK"}}]}\n\ndata: [DONE]\n\n'
JSON = b'{"choices":[{"message":{"role":"assistant","content":"OK"}}]}'


class _Answer:
    def __init__(self, body: bytes, stream: bool) -> None:
        self.status_code = 200
        self.raw_headers = [(b"content-type", b"text/event-stream" if stream else b"application/json")]
        self._body = body

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        yield self._body

    async def aread(self) -> bytes:
        return self._body

    async def aclose(self) -> None:
        pass


class AgentsOf:
    """The hosts whose agents still subscribe; every post is remembered by host."""

    def __init__(self, upstream: Any, alive: set[str]) -> None:
        self.alive = alive
        self.posts: list[str] = []
        self.route_target = upstream.route_target

    async def post(self, target: InferTarget, body: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
        self.posts.append(target.host_id)
        if target.host_id not in self.alive:
            raise NoResponders(f"{target}: no agent is serving host {target.host_id!r}", target.host_id)
        return _Answer(SSE if b'"stream":true' in body else JSON, b'"stream":true' in body)

    async def aclose(self) -> None:
        pass


@pytest.fixture
async def http(fleet: Fleet) -> AsyncIterator[httpx.AsyncClient]:  # noqa: F811
    app = Starlette(routes=build_routes(), exception_handlers=exception_handlers())
    app.state.gateway = fleet.gw
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        yield client


def _body(stream: bool) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream}


async def _two_replicas(fleet: Fleet, alive: set[str]) -> AgentsOf:  # noqa: F811
    for host, port in (("h1", 1), ("h2", 2)):
        claim = ready(managed=False, sha=None, port=port)
        await fleet.placements.admit(host, [claim])  # the operator admitted both external engines
        await fleet.heartbeat(host, claim)
    assert fleet.routes() == ["h1", "h2"]
    agents = AgentsOf(fleet.gw.upstream, alive)
    fleet.gw.upstream = agents  # type: ignore[assignment]
    return agents


@pytest.mark.parametrize("stream", [False, True])
async def test_no_responders_goes_to_the_other_replica_and_excludes_the_host_until_it_heartbeats(
    fleet: Fleet, http: httpx.AsyncClient, stream: bool,  # noqa: F811
) -> None:
    agents = await _two_replicas(fleet, alive={"h1"})
    for i in range(8):  # affinity spreads these over both replicas while both are routable
        r = await http.post(CHAT, json=_body(stream), headers={"X-Grid-Affinity-Key": f"user-{i}"})
        assert r.status_code == 200, r.text
        assert r.headers["x-grid-host"] == "h1"
        assert (b"[DONE]" in r.content) is stream
    # h2 was tried once: from then on it is excluded, without its breaker counting a failure.
    assert agents.posts.count("h2") == 1, agents.posts
    assert fleet.excluded() == {"h1": None, "h2": routing.EXCLUDED_NO_RESPONDERS}
    assert fleet.gw.breakers.state(("h2", "http://127.0.0.1:2", "m"), time.time()) == CLOSED
    stats = (await http.get("/gateway/stats")).json()
    assert [(h["host_id"], h["reason"]) for h in stats["unroutable_hosts"]] == [("h2", "no_responders")]
    assert stats["requests"]["no_responders_retried"] == 1
    text = exposition(fleet.gw.metrics.registry).decode()
    assert 'grid_gateway_unroutable_hosts{reason="no_responders"} 1.0' in text

    # Its agent is back and heartbeats: routable again at once.
    agents.alive.add("h2")
    await fleet.heartbeat("h2", ready(managed=False, sha=None, port=2))
    assert fleet.routes() == ["h1", "h2"] and fleet.gw.stats()["unroutable_hosts"] == []
    served = set()
    for i in range(8):
        r = await http.post(CHAT, json=_body(stream), headers={"X-Grid-Affinity-Key": f"user-{i}"})
        assert r.status_code == 200
        served.add(r.headers["x-grid-host"])
    assert served == {"h1", "h2"}
    assert 'grid_gateway_unroutable_hosts{reason="no_responders"} 0.0' in exposition(fleet.gw.metrics.registry).decode()


async def test_when_no_replica_answers_the_client_gets_a_503_not_a_502(fleet: Fleet, http: httpx.AsyncClient) -> None:  # noqa: F811
    agents = await _two_replicas(fleet, alive=set())
    r = await http.post(CHAT, json=_body(False))
    assert r.status_code == 503, r.text
    # (what the 503 says depends on the plan: this fleet has none, so "cannot be placed")
    assert r.json()["error"]["code"] != "upstream_error"
    assert sorted(agents.posts) == ["h1", "h2"]  # each tried once, never the same host twice
    assert fleet.excluded() == {"h1": routing.EXCLUDED_NO_RESPONDERS, "h2": routing.EXCLUDED_NO_RESPONDERS}


def test_a_marked_host_stays_excluded_until_a_newer_heartbeat() -> None:
    assert routing.still_unresponsive(100.0, 100.0)
    assert routing.still_unresponsive(100.0, 99.0)
    assert routing.still_unresponsive(100.0, None)
    assert not routing.still_unresponsive(100.0, 100.5)
    assert not routing.still_unresponsive(None, 100.5)
