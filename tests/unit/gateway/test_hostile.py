"""Hostile requests get OpenAI-shaped 400/401/404/413 answers, never a 500.

The gateway is served by uvicorn on a loopback port over the in-process log twin (no engine is
needed: every request here is refused before routing, or finds no ready model).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grid.config import GridConfig
from grid.events.log import InMemoryLog
from grid.gateway.app import RunningGateway, create_gateway_app, start_gateway
from grid.gateway.settings import GatewaySettings

LIMIT = 1024 * 1024
KEY = "client-secret-key"


async def _serve(home: Path, api_keys: list[str]) -> RunningGateway:
    app = create_gateway_app(InMemoryLog(), GridConfig(home=home, nats_url=None), api_keys=api_keys,
                             settings=GatewaySettings(max_body_bytes=LIMIT))
    return await start_gateway(app, "127.0.0.1", 0, write_url_file=False)


@pytest.fixture(scope="module")
async def open_gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    running = await _serve(tmp_path_factory.mktemp("gw-open"), [])
    async with httpx.AsyncClient(base_url=running.url, timeout=10.0) as client:
        yield client
    await running.stop()


@pytest.fixture(scope="module")
async def keyed_gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    running = await _serve(tmp_path_factory.mktemp("gw-keyed"), [KEY, "second-key"])
    async with httpx.AsyncClient(base_url=running.url, timeout=10.0) as client:
        yield client
    await running.stop()


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    if code is not None:
        assert body["error"]["code"] == code, body
    return body["error"]


CHAT = "/v1/chat/completions"
BAD_BODIES: list[tuple[bytes, str | None]] = [
    (b'{"model":', "invalid_json"),
    (b"", "invalid_json"),
    (b"\xff\xfe{}", "invalid_json"),
    (b"[1, 2]", "invalid_request_body"),
    (b'"a string"', "invalid_request_body"),
    (b"42", "invalid_request_body"),
    (b"null", "invalid_request_body"),
    (b'{"messages":[{"role":"user","content":"hi"}]}', "invalid_request_body"),
    (b'{"model":"m"}', "invalid_request_body"),
    (b'{"model":5,"messages":[]}', "invalid_request_body"),
    (b'{"model":"m","messages":"hi"}', "invalid_request_body"),
    (b'{"model":"m","messages":[1]}', "invalid_request_body"),
    (b'{"model":"m","messages":[{"role":"user","content":5}]}', "invalid_request_body"),
    (b'{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":7}]}]}', "invalid_request_body"),
    (b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":"yes"}', "invalid_request_body"),
    (b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":"10"}', "invalid_request_body"),
    (b'{"model":"m","messages":[]}', "invalid_request_body"),
    (b'{"model":"","messages":[{"role":"user","content":"hi"}]}', "invalid_request_body"),
    (json.dumps({"model": "m" * 300, "messages": [{"role": "user", "content": "x"}]}).encode(), "invalid_request_body"),
    (b'{"model":"a\\u0000b","messages":[{"role":"user","content":"x"}]}', "invalid_request_body"),
    (b'{"model":"m","junk":' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),
    (b'{"model":"m","messages":' + b"[" * 20_000 + b"}", None),
    (b'{"model":"m","messages":[{"role":"user","content":"x","name":' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000
     + b"}]}", None),
]


@pytest.mark.parametrize("body,code", BAD_BODIES, ids=[f"body{i}" for i in range(len(BAD_BODIES))])
async def test_hostile_chat_bodies_get_400(open_gateway: httpx.AsyncClient, body: bytes, code: str | None) -> None:
    r = await open_gateway.post(CHAT, content=body, headers={"content-type": "application/json"})
    err = assert_error(r, 400, code)
    assert err["type"] == "invalid_request_error"
    assert b"hi" not in r.content or b'"hi"' not in body  # never echoes content


async def test_hostile_completions_and_embeddings(open_gateway: httpx.AsyncClient) -> None:
    assert_error(await open_gateway.post("/v1/completions", json={"model": "m", "prompt": {"a": 1}}), 400)
    assert_error(await open_gateway.post("/v1/completions", json={"model": "m", "prompt": [[1, "x"]]}), 400)
    assert_error(await open_gateway.post("/v1/embeddings", json={"model": "m"}), 400)
    assert_error(await open_gateway.post("/v1/embeddings", json={"model": "m", "input": 3.5}), 400)


async def test_body_limit_is_413_declared_or_streamed(open_gateway: httpx.AsyncClient) -> None:
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (LIMIT + 10)}]}).encode()
    assert_error(await open_gateway.post(CHAT, content=big), 413, "request_too_large")

    async def chunked() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 4096):
            yield big[i:i + 4096]

    r = await open_gateway.post(CHAT, content=chunked())
    assert "content-length" not in r.request.headers
    assert_error(r, 413, "request_too_large")


async def test_bad_affinity_keys_are_400(open_gateway: httpx.AsyncClient) -> None:
    ok = {"model": "nope", "messages": [{"role": "user", "content": "x"}]}
    assert_error(await open_gateway.post(CHAT, json=ok, headers={"X-Grid-Affinity-Key": b"x" * 257}), 400,
                 "invalid_affinity_key")
    for value in (b"\xff\xfe", b"a\x7fb"):
        r = await open_gateway.post(CHAT, json=ok, headers={"X-Grid-Affinity-Key": value})
        # h11 passes such bytes to the app; httptools refuses them itself with a bare 400
        assert r.status_code == 400
        if r.headers.get("content-type") == "application/json":
            assert_error(r, 400, "invalid_affinity_key")
    # a valid key passes validation (and then finds no such model)
    assert_error(await open_gateway.post(CHAT, json=ok, headers={"X-Grid-Affinity-Key": "s-1"}), 404,
                 "model_not_found")


async def test_unknown_model_auto_and_unknown_paths(open_gateway: httpx.AsyncClient) -> None:
    msg = [{"role": "user", "content": "hello"}]
    err = assert_error(await open_gateway.post(CHAT, json={"model": "nope", "messages": msg}), 404, "model_not_found")
    assert err["param"] == "model"
    r = await open_gateway.post(CHAT, json={"model": "auto", "messages": msg})
    assert_error(r, 503, "model_not_ready")
    assert int(r.headers["retry-after"]) >= 1
    assert_error(await open_gateway.get("/v1/nothing-here"), 404, "not_found")
    assert_error(await open_gateway.get(CHAT), 405, "method_not_allowed")
    assert_error(await open_gateway.get("/v1/models/none"), 404, "model_not_found")
    assert (await open_gateway.get("/v1/models")).json() == {"data": [], "object": "list"}
    stats = (await open_gateway.get("/gateway/stats")).json()
    assert stats["requests"]["bad_request"] >= 1 and stats["telemetry"]["dropped"] == 0


async def test_client_keys_are_required_when_configured(keyed_gateway: httpx.AsyncClient) -> None:
    body = {"model": "nope", "messages": [{"role": "user", "content": "x"}]}
    assert_error(await keyed_gateway.post(CHAT, json=body), 401, "invalid_api_key")
    assert_error(await keyed_gateway.post(CHAT, json=body, headers={"Authorization": "Bearer wrong"}), 401)
    assert_error(await keyed_gateway.post(CHAT, json=body, headers={"Authorization": KEY}), 401)
    assert_error(await keyed_gateway.get("/v1/models"), 401)
    assert_error(await keyed_gateway.get("/gateway/stats"), 401)
    # a right key (either one) gets past authentication
    for key in (KEY, "second-key"):
        r = await keyed_gateway.post(CHAT, json=body, headers={"Authorization": f"Bearer {key}"})
        assert_error(r, 404, "model_not_found")
    assert (await keyed_gateway.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})).status_code == 200
    assert (await keyed_gateway.get("/gateway/health")).status_code == 200
    # authentication comes before body parsing: a hostile body without a key is still 401
    assert_error(await keyed_gateway.post(CHAT, content=b"[[[["), 401)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["model", "messages", "stream", "max_tokens", "prompt", "input", "content", "role", "x"]),
        children, max_size=5),
    max_leaves=20,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from([CHAT, "/v1/completions", "/v1/embeddings"]),
       body=st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode())))
async def test_property_never_a_500(open_gateway: httpx.AsyncClient, path: str, body: bytes) -> None:
    r = await open_gateway.post(path, content=body)
    assert r.status_code in (400, 404, 413, 503), (r.status_code, r.text)
    assert_error(r, r.status_code)
