"""Only the grid's owner may mark inference as an evaluation (real gateway, NATS, llama-server).

An evaluation-marked request creates no demand, so a client key that could mark its requests
could hide its demand from the allocator: the marking needs the operator token.
"""

from __future__ import annotations

import secrets

import pytest

from grid.secrets import write_owner_only

from .conftest import MODEL, Engine, GatewayFactory, ready

pytestmark = pytest.mark.slow

HEADER = "X-Grid-Evaluation-Token"
CLIENT_KEY = "client-key-eval"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 4}


async def test_only_the_owner_token_marks_a_request_as_evaluation(make_gateway: GatewayFactory,
                                                                  engines: dict[str, Engine]) -> None:
    gw = await make_gateway(api_keys=[CLIENT_KEY])
    owner = secrets.token_hex(32)
    write_owner_only(gw.home / "operator.token", (owner + "\n").encode())
    await gw.heartbeat("host-a", ready(engines["host-a"].endpoint, sha="e" * 64))
    client = {"Authorization": f"Bearer {CLIENT_KEY}"}

    # A client key, any other value, or an empty header cannot mark: refused, nothing served or recorded.
    for presented in (CLIENT_KEY, "wrong-token", owner + "x", ""):
        r = await gw.http.post("/v1/chat/completions", json=BODY, headers={**client, HEADER: presented})
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "evaluation_not_allowed"
    assert (await gw.stats())["requests"]["evaluation_refused"] == 4

    # Ordinary traffic is served and counted as demand; the owner's is marked.
    plain = await gw.http.post("/v1/chat/completions", json=BODY, headers=client)
    assert plain.status_code == 200, plain.text
    marked = await gw.http.post("/v1/chat/completions", json=BODY, headers={**client, HEADER: owner})
    assert marked.status_code == 200, marked.text
    recs = await gw.records(want=lambda rs: len(rs) >= 2)
    assert [(r.evaluation, r.outcome, r.host_id) for r in recs] == [(False, "ok", "host-a"), (True, "ok", "host-a")]
    assert recs[1].output_units > 0 and recs[1].service_seconds > 0  # still a throughput sample
    raw = await gw.raw_request_log()
    assert owner.encode() not in raw and CLIENT_KEY.encode() not in raw
