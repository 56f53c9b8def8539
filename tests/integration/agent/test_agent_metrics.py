"""The agent's loopback /metrics listener: scraped from the running agent, parsed as exposition."""

from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from grid.agent.http import METRICS_URL_FILE
from grid.cli.node import node_app
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import make_command, wait_ack


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


async def test_agent_metrics_listener(js_log: JetStreamLog, start_agent) -> None:
    agent = await start_agent()
    url = agent.http.url
    assert url.startswith("http://127.0.0.1:")
    assert (agent.paths.root / METRICS_URL_FILE).read_text().strip() == url
    assert (agent.paths.root / METRICS_URL_FILE).stat().st_mode & 0o077 == 0

    await js_log.append(make_command("m-drain", "drain"))
    assert (await wait_ack(js_log, "m-drain")).status == "succeeded"

    async with httpx.AsyncClient(trust_env=False) as http:
        r = await http.get(f"{url}/metrics")
    assert r.status_code == 200
    m = _samples(r.text)
    assert m[("grid_agent_action_seconds_count", (("kind", "drain"), ("status", "succeeded")))] == 1
    assert m[("grid_agent_protection_state", (("state", "accepting"),))] == 1
    assert m[("grid_agent_protection_state", (("state", "quarantined"),))] == 0
    assert m[("grid_agent_residencies", (("state", "ready"),))] == 0
    assert m[("grid_agent_action_in_flight", ())] == 0
    # The command queue held nothing unproven (this grid has no identities: nothing to verify).
    assert m[("grid_events_rejected_total", (("reason", "unsigned"),))] == 0

    # gridctl node status shows where to scrape
    out = CliRunner().invoke(node_app, ["status", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["metrics_url"] == url
    text = CliRunner().invoke(node_app, ["status"]).output
    assert f"metrics: {url}/metrics" in text

    await agent.stop(drain=True)
    assert not (agent.paths.root / METRICS_URL_FILE).exists()
    assert json.loads(CliRunner().invoke(node_app, ["status", "--json"]).output)["metrics_url"] is None


async def test_a_port_in_use_is_a_warning_not_a_failed_agent(tmp_path) -> None:
    import socket

    from grid.agent.http import agent_metrics, start_listener
    from grid.agent.protection import ProtectionStatus
    from grid.agent.state import AgentState

    warnings: list[str] = []
    metrics = agent_metrics(AgentState, ProtectionStatus)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert await start_listener(metrics, tmp_path, port, warnings.append) is None
    assert warnings and warnings[0].startswith("metrics_listener_failed")
    assert not (tmp_path / METRICS_URL_FILE).exists()
    assert await start_listener(metrics, tmp_path, None, warnings.append) is None  # no listener asked for
