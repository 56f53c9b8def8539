"""`gridctl up`'s one process: the gateway hands requests for its own host to that host's agent
in process (grid.infer.local), with nothing of them crossing the embedded nats-server (real
server with identities, controller, agent, llama-server, SmolLM2 GGUF)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from grid.events.subjects import infer_cancel_subject, infer_request_subject
from grid.localgrid import LocalGrid
from tests.e2e.localgrid_kit import local_grid, wait_served

pytestmark = pytest.mark.e2e


def _infer_subscriptions(grid: LocalGrid) -> dict[str, int]:
    """Messages the server delivered to the agent's inference subscriptions, by subject."""
    assert grid.embedded is not None
    status, body = grid.embedded.monitor("/connz?subs=detail&limit=1024")
    assert status == 200
    wanted = {infer_request_subject(grid.agent.host_id), infer_cancel_subject(grid.agent.host_id)}
    found: dict[str, int] = {}
    conns: list[dict[str, Any]] = body["connections"]  # type: ignore[index]
    for conn in conns:
        for sub in conn.get("subscriptions_list_detail") or ():
            if sub["subject"] in wanted:
                found[sub["subject"]] = found.get(sub["subject"], 0) + int(sub.get("msgs", 0))
    assert set(found) == wanted, found  # the agent still serves NATS for everyone else
    return found


async def test_chat_and_stream_go_to_the_agent_in_process(tmp_path: Path, bundled_model_home: Path) -> None:
    grid = local_grid(tmp_path, bundled_model_home)
    await grid.start()
    client = openai.AsyncOpenAI(base_url=f"{grid.gateway_url}/v1", api_key="unused", max_retries=0)
    try:
        model = await wait_served(grid, client)
        before = _infer_subscriptions(grid)
        responder = grid.agent.responder
        served = responder.served

        reply = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                     max_tokens=4)
        assert reply.choices[0].message.content
        stream = await client.chat.completions.create(model=model, stream=True, max_tokens=8,
                                                      messages=[{"role": "user", "content": "Count to three"}])
        pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        assert "".join(pieces)
        # A client that leaves mid-stream: the cancel also stays in process and frees the slot.
        stream = await client.chat.completions.create(model=model, stream=True, max_tokens=2000,
                                                      messages=[{"role": "user", "content": "Count to a thousand"}])
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        await stream.close()
        deadline = time.monotonic() + 10
        while responder.in_flight:
            assert time.monotonic() < deadline, "the agent kept generating for a client that left"
            await asyncio.sleep(0.05)

        assert responder.delivered_in_process == 3 and responder.served == served + 2
        assert responder.cancelled == 1
        assert _infer_subscriptions(grid) == before  # not one message through the broker
    finally:
        await client.close()
        await grid.stop()
