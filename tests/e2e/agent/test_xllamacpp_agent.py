"""The agent loads the real SmolLM2 GGUF through the prebuilt xllamacpp runtime and a chat is
served through the gateway (embedded nats-server, controller, agent, gateway: real processes)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai
import psutil
import pytest

from grid.agent.engines.runtime import XLLAMACPP, XLLAMACPP_MODULE
from grid.agent.service import AgentOptions
from grid.config import GridConfig
from grid.controller.service import ControllerSettings
from grid.localgrid import LocalGrid, bundled_profile
from tests.ports import engine_ports

pytestmark = pytest.mark.e2e


async def test_agent_serves_through_xllamacpp(tmp_path: Path, bundled_model_home: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "artifacts").symlink_to(bundled_model_home / "artifacts")
    grid = LocalGrid(
        GridConfig(home=home, nats_url=None),
        profile=bundled_profile(embeddings=True),
        agent_options=AgentOptions(failure_domain="local", heartbeat_interval=0.5, sample_interval=0.5,
                                   port_range=engine_ports(), llama_server=XLLAMACPP),
        controller_settings=ControllerSettings(tick_interval_seconds=1.0, restart_grace_seconds=0.0),
    )
    await grid.start()
    model = grid.profile.model_id
    client = openai.AsyncOpenAI(base_url=f"{grid.gateway_url}/v1", api_key="unused", max_retries=0, timeout=120)
    pid = None
    try:
        assert grid.agent.runtime is not None and grid.agent.runtime.name == XLLAMACPP
        deadline = time.monotonic() + 180
        while grid.residency_state(model) != "ready":
            assert time.monotonic() < deadline, f"{model} never became ready on xllamacpp"
            await asyncio.sleep(0.5)
        rec = grid.agent.state.residencies[model]
        assert rec.process is not None and rec.spawn_argv is not None
        assert XLLAMACPP_MODULE in rec.spawn_argv and "--embeddings" in rec.spawn_argv
        pid = rec.process.pid
        assert XLLAMACPP_MODULE in " ".join(psutil.Process(pid).cmdline())
        for _ in range(40):
            if [m.id for m in (await client.models.list()).data] == [model]:
                break
            await asyncio.sleep(0.25)
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Reply with one word: hello"}], max_tokens=8)
        assert reply.choices[0].message.content and reply.usage is not None and reply.usage.completion_tokens > 0
        emb = await client.embeddings.create(model=model, input="hello")
        assert len(emb.data[0].embedding) > 100
    finally:
        await client.close()
        await grid.stop()
    assert pid is not None and not psutil.pid_exists(pid)  # drained and stopped with the grid
