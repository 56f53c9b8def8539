"""A damaged fence in the state file is a quarantine, never a silent zero.

A real agent accepts a term-4 command, stops; its state file is edited (a key renamed, or the
key removed); the restarted agent must quarantine the file and still refuse term 3.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from grid.agent import fencing
from grid.agent.service import HostAgent
from grid.agent.state import AgentPaths
from grid.config import GridConfig
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import agent_factory, heartbeats, make_command, wait_ack, wait_for
from tests.ports import engine_ports


@pytest.fixture
def grid_config(grid_home: Path) -> GridConfig:
    return GridConfig(home=grid_home, nats_url=None)


@pytest.fixture
async def start_agent(js_log: JetStreamLog, grid_config: GridConfig) -> AsyncIterator[Callable[..., Awaitable[HostAgent]]]:
    async with agent_factory(js_log, grid_config, heartbeat_interval=0.2, sample_interval=0.1,
                             port_range=engine_ports()) as factory:
        yield factory


def _rename_key(path: Path) -> None:
    data = path.read_bytes()
    assert data.count(b'"highest_term"') == 1
    path.write_bytes(data.replace(b'"highest_term"', b'"highest_terx"'))


def _drop_key(path: Path) -> None:
    state = json.loads(path.read_text())
    del state["highest_term"]
    path.write_text(json.dumps(state))


@pytest.mark.parametrize("edit", [_rename_key, _drop_key], ids=["renamed_key", "missing_key"])
async def test_damaged_fence_is_quarantined_and_the_term_still_holds(
    edit, js_log: JetStreamLog, start_agent, grid_config: GridConfig,
):
    agent = await start_agent()
    await js_log.append(make_command("t4", "drain", term=4, controller_id="ctl-4"))
    assert (await wait_ack(js_log, "t4")).status == "succeeded"

    async def reported_term_4():
        hbs = await heartbeats(js_log)
        return hbs and hbs[-1].highest_term == 4

    await wait_for(reported_term_4)
    await agent.stop(drain=True)
    paths = AgentPaths.for_config(grid_config)
    edit(paths.state)

    agent = await start_agent()
    assert any(w.startswith("state_file_quarantined") for w in agent.warnings), agent.warnings
    assert [p.name for p in paths.root.iterdir() if p.name.startswith("state.json.corrupt-")]
    assert agent.state.highest_term == 4
    await js_log.append(make_command("t3", "drain", term=3, controller_id="ctl-3"))
    ack = await wait_ack(js_log, "t3")
    assert ack.status == "rejected" and ack.message.startswith(fencing.REASON_STALE_TERM), ack
