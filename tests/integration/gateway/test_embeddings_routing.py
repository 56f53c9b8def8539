"""Embeddings are routed by capability, and an engine's refusal reaches the caller in the
OpenAI shape (string code, param), through the official openai client."""

from __future__ import annotations

import openai
import pytest

from grid.events.control import ModelProfile

from .conftest import MODEL, Engine, GatewayFactory, ready

pytestmark = pytest.mark.slow


async def test_embeddings_to_a_chat_only_profile_never_reach_the_engine(make_gateway: GatewayFactory,
                                                                       engines: dict[str, Engine]) -> None:
    gw = await make_gateway()
    await gw.profile(ModelProfile(model_id=MODEL, memory_mb=300))  # embeddings: false (the default)
    await gw.heartbeat("host-a", ready(engines["host-a"].endpoint))
    with pytest.raises(openai.BadRequestError) as info:
        await gw.client.embeddings.create(model=MODEL, input="hello")
    err = info.value.body
    assert (err["code"], err["param"], err["type"]) == \
        ("model_does_not_support_embeddings", "model", "invalid_request_error")
    stats = await gw.stats()
    assert [r["served"] for r in stats["routes"]] == []  # no route was ever chosen
    assert stats["requests"]["unsupported_endpoint"] == 1
    # chat on the same model is unaffected
    assert (await gw.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)).choices  # type: ignore[list-item]


async def test_engine_refusals_are_rewritten_to_the_openai_shape(make_gateway: GatewayFactory,
                                                                engines: dict[str, Engine]) -> None:
    gw = await make_gateway()
    # No profile: capability unknown, so the engine (started without --embeddings) answers 501
    # with a numeric code; the caller sees a string code.
    await gw.heartbeat("host-a", ready(engines["host-a"].endpoint, model="unprofiled"))
    r = await gw.http.post("/v1/embeddings", json={"model": "unprofiled", "input": "hello"},
                           headers=gw.auth_headers())
    assert r.status_code == 501, r.text
    err = r.json()["error"]
    assert err["code"] == "unsupported_endpoint" and isinstance(err["code"], str)
    assert "param" in err and err["param"] is None
    assert err["type"] == "not_supported_error" and "embeddings" in err["message"]

    # A prompt longer than the engine's context: llama-server's 400 {"code": 400, ...}.
    await gw.heartbeat("host-a", ready(engines["host-a"].endpoint))
    with pytest.raises(openai.BadRequestError) as info:
        await gw.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "lorem ipsum dolor " * 600}], max_tokens=2)
    body = info.value.body
    assert isinstance(body["code"], str) and body["code"] and "param" in body
