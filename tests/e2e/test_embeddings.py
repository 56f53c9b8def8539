"""Embeddings end to end: a profile with embeddings on -> the agent starts llama-server with
--embeddings -> the gateway routes /v1/embeddings to it -> the official openai client gets
vectors (real nats-server, controller, agent, llama-server, SmolLM2 GGUF)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai
import pytest

from grid.agent.service import AgentOptions
from grid.config import GridConfig
from grid.controller.service import ControllerSettings
from grid.localgrid import LocalGrid, bundled_profile
from tests.ports import engine_ports

pytestmark = pytest.mark.e2e


async def test_openai_embeddings_create_end_to_end(tmp_path: Path, bundled_model_home: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "artifacts").symlink_to(bundled_model_home / "artifacts")
    grid = LocalGrid(
        GridConfig(home=home, nats_url=None),
        profile=bundled_profile(embeddings=True),
        agent_options=AgentOptions(failure_domain="local", heartbeat_interval=0.5, sample_interval=0.5,
                                   port_range=engine_ports()),
        controller_settings=ControllerSettings(tick_interval_seconds=1.0, restart_grace_seconds=0.0),
    )
    await grid.start()
    model = grid.profile.model_id
    client = openai.AsyncOpenAI(base_url=f"{grid.gateway_url}/v1", api_key="unused", max_retries=0)
    try:
        deadline = time.monotonic() + 120
        while grid.residency_state(model) != "ready":
            assert time.monotonic() < deadline, f"{model} never became ready"
            await asyncio.sleep(0.5)
        rec = grid.agent.state.residencies[model]
        assert rec.spawn_argv is not None and "--embeddings" in rec.spawn_argv
        for _ in range(40):
            if [m.id for m in (await client.models.list()).data] == [model]:
                break
            await asyncio.sleep(0.25)
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
