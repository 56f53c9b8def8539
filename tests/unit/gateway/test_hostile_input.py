"""Issue 37's gateway items: a chat role OpenAI does not define, max_tokens beyond the model's
known context window, and a body that says it is not JSON each get an OpenAI-shaped refusal
naming what is accepted, reach no engine and add no telemetry record.

The gateway is served by uvicorn over the in-process log twin; the engine is a scripted loopback
server (tests.unit.gateway.test_proxy_upstream) that records every request it is sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from grid.config import GridConfig
from grid.events import codec
from grid.events.control import ModelProfile
from grid.events.log import InMemoryLog
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import REQUESTS_STREAM
from grid.gateway.app import create_gateway_app, start_gateway
from grid.gateway.bodies import CHAT_ROLES
from grid.gateway.settings import GatewaySettings

from tests.unit.gateway.test_hostile import assert_error
from tests.unit.gateway.test_proxy_upstream import CHAT, ScriptedEngine, Served, ok_reply

CONTEXT = 512  # the profile's context window, tokens per slot


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Served, ScriptedEngine]]:
    log = InMemoryLog()
    # Engines are reached over loopback HTTP here (the in-process log has no NATS to carry them).
    settings = GatewaySettings(upstream_backend="h1", telemetry_flush_seconds=0.05)
    app = create_gateway_app(log, GridConfig(home=tmp_path, nats_url=None), api_keys=[], settings=settings)
    running = await start_gateway(app, "127.0.0.1", 0, write_url_file=False)
    engine = await ScriptedEngine(ok_reply).start()
    try:
        async with httpx.AsyncClient(base_url=running.url, timeout=10.0) as http:
            s = Served(log, running, http)
            await s.profile(ModelProfile(model_id="m", memory_mb=300, context_size=CONTEXT))
            await s.heartbeat("h-1", engine.endpoint, "m")
            await s.heartbeat("h-2", engine.endpoint, "free")  # placed, no profile: context unknown
            yield s, engine
    finally:
        await engine.stop()
        await running.stop()


async def records(log: InMemoryLog) -> list[RequestFeatures]:
    out: list[RequestFeatures] = []
    async for msg in log.replay(REQUESTS_STREAM):
        event = codec.decode(msg.data)
        if isinstance(event, RequestBatch):
            out.extend(event.records)
    return out


async def only_the_served_ones_recorded(s: Served, served: int) -> None:
    """The refused requests left no trace: exactly the `served` successful ones are recorded."""
    await s.records(served)
    await asyncio.sleep(0.3)  # several telemetry flushes: a refused one would have landed by now
    found = await records(s.log)
    assert len(found) == served and all(r.outcome == "ok" for r in found), found


def msgs(*roles: str) -> list[dict[str, str]]:
    return [{"role": role, "content": "x"} for role in roles]


async def test_a_role_openai_does_not_define_is_400_and_reaches_no_engine(
        served: tuple[Served, ScriptedEngine]) -> None:
    s, engine = served
    for roles, at in ((("wizard",), 0), (("system", "user", "wizard"), 2), (("USER",), 0), (("",), 0)):
        r = await s.http.post(CHAT, json={"model": "m", "messages": msgs(*roles)})
        err = assert_error(r, 400, "invalid_request_body")
        assert err["param"] == f"messages[{at}].role", err
        assert ", ".join(CHAT_ROLES) in err["message"] and "wizard" not in err["message"], err
    assert engine.requests == []
    # Every OpenAI chat role passes (one request naming them all reaches the engine once).
    r = await s.http.post(CHAT, json={"model": "m", "messages": msgs(*CHAT_ROLES)})
    assert r.status_code == 200, r.text
    assert len(engine.requests) == 1
    await only_the_served_ones_recorded(s, 1)


async def test_max_tokens_beyond_the_profiles_context_is_400_context_length_exceeded(
        served: tuple[Served, ScriptedEngine]) -> None:
    s, engine = served
    for field in ("max_tokens", "max_completion_tokens"):
        r = await s.http.post(CHAT, json={"model": "m", "messages": msgs("user"), field: CONTEXT + 1})
        err = assert_error(r, 400, "context_length_exceeded")
        assert err["param"] == field and f"{CONTEXT} tokens" in err["message"], err
    r = await s.http.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 100_000})
    assert assert_error(r, 400, "context_length_exceeded")["param"] == "max_tokens"
    assert engine.requests == []
    # At the window it goes through; with no profile the window is unknown and the engine decides.
    r = await s.http.post(CHAT, json={"model": "m", "messages": msgs("user"), "max_tokens": CONTEXT})
    assert r.status_code == 200, r.text
    r = await s.http.post(CHAT, json={"model": "free", "messages": msgs("user"), "max_tokens": 100_000})
    assert r.status_code == 200, r.text
    assert len(engine.requests) == 2
    stats = (await s.http.get("/gateway/stats")).json()
    assert stats["requests"]["context_length_exceeded"] == 3
    await only_the_served_ones_recorded(s, 2)


@pytest.mark.parametrize("content_type", [
    "text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
    "application/xml", "application/jsonx", "text/json", "", "application/\xe9+json",
])
async def test_a_body_that_is_not_declared_json_is_415(served: tuple[Served, ScriptedEngine],
                                                       content_type: str) -> None:
    s, engine = served
    body = b'{"model":"m","messages":[{"role":"user","content":"x"}]}'
    for path in (CHAT, "/v1/completions", "/v1/embeddings"):
        r = await s.http.post(path, content=body, headers={"content-type": content_type.encode("latin-1")})
        err = assert_error(r, 415, "unsupported_media_type")
        assert "application/json" in err["message"], err
        assert r.headers["connection"] == "close"
    assert engine.requests == []
    assert await records(s.log) == []


async def test_json_content_types_and_none_are_accepted(served: tuple[Served, ScriptedEngine]) -> None:
    s, engine = served
    body = b'{"model":"m","messages":[{"role":"user","content":"x"}]}'
    accepted = ["application/json", "Application/JSON; charset=utf-8", "application/vnd.openai+json", None]
    for content_type in accepted:
        headers = {} if content_type is None else {"content-type": content_type}
        r = await s.http.post(CHAT, content=body, headers=headers)
        assert r.status_code == 200, (content_type, r.text)
    assert len(engine.requests) == len(accepted)
