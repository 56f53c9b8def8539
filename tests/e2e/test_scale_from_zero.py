"""A model with zero replicas is scaled up by demand alone and then answers (real processes).

Embedded nats-server, controller (automatic), gateway and agent with a real llama-server child
running the real SmolLM2 GGUF. The first request gets an honest 503 with Retry-After; the demand
it recorded reaches the forecast, the planner places a replica, the agent warms it, and the
same request then gets a real answer through the official openai client.
"""

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


@pytest.fixture
async def zero_replica_grid(tmp_path: Path, bundled_model_home: Path):  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    home.mkdir()
    (home / "artifacts").symlink_to(bundled_model_home / "artifacts")
    grid = LocalGrid(
        GridConfig(home=home, nats_url=None),
        profile=bundled_profile(min_replicas=0, max_replicas=1, min_residency_seconds=5.0),
        agent_options=AgentOptions(failure_domain="local", heartbeat_interval=0.5, sample_interval=0.5,
                                   port_range=engine_ports()),
        controller_settings=ControllerSettings(tick_interval_seconds=1.0, restart_grace_seconds=0.0),
    )
    await grid.start()
    try:
        yield grid
    finally:
        await grid.stop()


async def test_demand_scales_a_model_from_zero_to_ready(zero_replica_grid: LocalGrid) -> None:
    grid = zero_replica_grid
    model = grid.profile.model_id
    client = openai.AsyncOpenAI(base_url=f"{grid.gateway_url}/v1", api_key="unused", max_retries=0)
    try:
        listed = await client.models.list()
        assert [m.id for m in listed.data] == []  # nothing is READY: nothing is listed
        await asyncio.sleep(2.0)
        assert grid.residency_state(model) is None  # and nothing is placed without demand

        with pytest.raises(openai.APIStatusError) as info:
            await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert info.value.status_code == 503
        assert float(info.value.response.headers["retry-after"]) > 0
        assert info.value.body["code"] or info.value.body["message"]  # OpenAI error shape

        deadline = time.monotonic() + 120
        while grid.residency_state(model) != "ready":
            assert time.monotonic() < deadline, f"{model} never became ready: {grid.controller.status()}"
            await asyncio.sleep(0.5)

        for _ in range(20):  # the gateway's projection follows the READY heartbeat
            listed = await client.models.list()
            if [m.id for m in listed.data] == [model]:
                break
            await asyncio.sleep(0.25)
        assert [m.id for m in listed.data] == [model]
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Reply with one word: hello"}], max_tokens=8
        )
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens > 0
    finally:
        await client.close()
