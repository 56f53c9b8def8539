"""Embeddings end to end: a profile with embeddings on -> the agent starts llama-server with
--embeddings -> the gateway routes /v1/embeddings to it -> the official openai client gets
vectors (real nats-server, controller, agent, llama-server, SmolLM2 GGUF)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.e2e.localgrid_kit import local_grid, wait_served

pytestmark = pytest.mark.e2e


async def test_openai_embeddings_create_end_to_end(tmp_path: Path, bundled_model_home: Path) -> None:
    grid = local_grid(tmp_path, bundled_model_home, embeddings=True)
    await grid.start()
    client = openai.AsyncOpenAI(base_url=f"{grid.gateway_url}/v1", api_key="unused", max_retries=0)
    try:
        model = await wait_served(grid, client)
        rec = grid.agent.state.residencies[model]
        assert rec.spawn_argv is not None and "--embeddings" in rec.spawn_argv
        out = await client.embeddings.create(model=model, input=["hello world", "goodbye"])
        assert len(out.data) == 2 and out.data[1].index == 1
        assert len(out.data[0].embedding) > 100 and any(v != 0.0 for v in out.data[0].embedding)
        # the same engine still chats
        reply = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                     max_tokens=4)
        assert reply.choices[0].message.content
    finally:
        await client.close()
        await grid.stop()
