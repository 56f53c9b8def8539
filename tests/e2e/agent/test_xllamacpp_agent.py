"""The agent loads the real SmolLM2 GGUF through the prebuilt xllamacpp runtime and a chat is
served through the gateway (embedded nats-server, controller, agent, gateway: real processes)."""

from __future__ import annotations

from pathlib import Path

import openai
import psutil
import pytest

from grid.agent.engines.runtime import XLLAMACPP, XLLAMACPP_MODULE
from tests.e2e.localgrid_kit import local_grid, wait_served

pytestmark = pytest.mark.e2e


async def test_agent_serves_through_xllamacpp(tmp_path: Path, bundled_model_home: Path) -> None:
    grid = local_grid(tmp_path, bundled_model_home, embeddings=True, llama_server=XLLAMACPP)
    await grid.start()
    client = openai.AsyncOpenAI(base_url=f"{grid.gateway_url}/v1", api_key="unused", max_retries=0, timeout=120)
    pid = None
    try:
        assert grid.agent.runtime is not None and grid.agent.runtime.name == XLLAMACPP
        model = await wait_served(grid, client, timeout=180)
        rec = grid.agent.state.residencies[model]
        assert rec.process is not None and rec.spawn_argv is not None
        assert XLLAMACPP_MODULE in rec.spawn_argv and "--embeddings" in rec.spawn_argv
        pid = rec.process.pid
        assert XLLAMACPP_MODULE in " ".join(psutil.Process(pid).cmdline())
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Reply with one word: hello"}], max_tokens=8)
        assert reply.choices[0].message.content and reply.usage is not None and reply.usage.completion_tokens > 0
        emb = await client.embeddings.create(model=model, input="hello")
        assert len(emb.data[0].embedding) > 100
    finally:
        await client.close()
        await grid.stop()
    assert pid is not None and not psutil.pid_exists(pid)  # drained and stopped with the grid
