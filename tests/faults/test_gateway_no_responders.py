"""A dead agent costs no request: two hosts serve the model, one agent is killed (SIGKILL; its
engine lives on) between two requests of a steady sequential load through the gateway.

NATS answers "no responders" at once for the dead host's inference subject, which proves the
request reached nobody: the gateway routes it again to the other replica (a delivered POST is
still never replayed) and marks the host unroutable until it heartbeats again. Before, every
request the gateway sent there failed with a 502 until the host's heartbeat went stale (30 s).

Real parts: `gridctl test start --machines 2` (NATS with identities, controller, gateway, two
agents that joined by invitation, llama.cpp with the SmolLM2 GGUF).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID
from grid.fleet import ADMITTING_HOST_STATES
from grid.gateway.routing import EXCLUDED_NO_RESPONDERS
from grid.testfleet import fleet as fleetlib
from grid.testfleet.state import load_state
from tests.integration.testfleet.test_fleet_cli import gridctl, seed_fleet_models
from tests.e2e.test_fleet import wait_until

pytestmark = pytest.mark.e2e

MODEL = BUNDLED_MODEL_ID
VICTIM, SURVIVOR = "h2", "h1"
REQUESTS_BEFORE_KILL = 6
# Long enough for the breaker's half-open probes (1, 2, 4 s backoff) to show, short of the 30 s
# heartbeat freshness window (the exclusion must come from NATS, not from staleness).
LOAD_SECONDS_AFTER_KILL = 12.0


@dataclass
class Fleet:
    home: Path
    gateway: str

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        state = load_state(self.home / "testfleet")
        assert state is not None
        return fleetlib.admin_request(state, method, path, body)

    def ready(self) -> set[str]:
        hosts = self.admin("GET", "/allocator/status")["hosts"]
        return {h["host_id"] for h in hosts if h["fresh"] and h["state"] in ADMITTING_HOST_STATES
                and any(r["model_id"] == MODEL and r["state"] == "ready" for r in h["residencies"])}

    def fresh(self, host_id: str) -> bool:
        return any(h["host_id"] == host_id and h["fresh"] for h in self.admin("GET", "/allocator/status")["hosts"])


@pytest.fixture
def fleet(tmp_path: Path, bundled_model_home: Path, llama_server_bin: Path) -> Iterator[Fleet]:
    seed_fleet_models(tmp_path, bundled_model_home)
    try:
        started = gridctl(tmp_path, "test", "start", "--machines", "2", "--engine-port-base", "43600", "--json")
        assert started.returncode == 0, started.stderr
        yield Fleet(tmp_path, json.loads(started.stdout)["gateway_url"])
    finally:
        gridctl(tmp_path, "test", "stop", timeout=180)


def _ask(client: httpx.Client, key: str, stream: bool) -> tuple[int, str | None]:
    """One chat completion (streamed or not): (status, serving host)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Reply with OK"}], "max_tokens": 4,
            "stream": stream}
    try:
        with client.stream("POST", "/v1/chat/completions", json=body,
                           headers={"X-Grid-Affinity-Key": key}) as r:
            content = r.read()
            if r.status_code == 200 and stream and b"[DONE]" not in content:
                return 599, r.headers.get("x-grid-host")  # a cut stream is a failure too
            return r.status_code, r.headers.get("x-grid-host")
    except httpx.HTTPError:
        return 598, None


def test_a_killed_agent_costs_no_request_and_its_host_comes_back(fleet: Fleet) -> None:
    fleet.admin("PATCH", f"/allocator/models/{MODEL}", {"min_replicas": 2, "max_replicas": 2})
    wait_until("a ready replica on both hosts", lambda: fleet.ready() == {VICTIM, SURVIVOR}, 180)
    client = httpx.Client(base_url=fleet.gateway, timeout=120)

    victim_keys: list[str] = []

    def served_by_both(prefix: str) -> bool:
        seen = set()
        for i in range(12):
            host = _ask(client, f"{prefix}-{i}", False)[1]
            seen.add(host)
            if host == VICTIM:
                victim_keys.append(f"{prefix}-{i}")
        return seen == {VICTIM, SURVIVOR}

    wait_until("the gateway routing to both hosts", lambda: served_by_both("warm"), 60, interval=1.0)

    # Steady sequential load, streamed and not by turns, spread over both replicas by affinity
    # (every other key one the victim served: the load keeps asking for it after the kill).
    results: list[tuple[float, int, str | None]] = []
    killed_at = 0.0
    i = 0
    while not killed_at or time.monotonic() - killed_at < LOAD_SECONDS_AFTER_KILL:
        if i == REQUESTS_BEFORE_KILL:  # between two requests: nothing of the victim's is in flight
            fleetlib.kill_agent(fleet.home / "testfleet", VICTIM)
            killed_at = time.monotonic()
            # A request published in the same instant can still reach the dead agent's socket
            # before nats-server has read its EOF: delivered, so never replayed (a 504 after the
            # connect timeout). That is a request in flight at the kill, not this test's subject.
            time.sleep(0.25)
        key = victim_keys[(i // 2) % len(victim_keys)] if i % 2 == 0 else f"load-{i}"
        status, host = _ask(client, key, stream=i % 4 in (1, 2))
        results.append((time.monotonic(), status, host))
        i += 1
    after = results[REQUESTS_BEFORE_KILL:]
    stamps = [killed_at] + [t for t, status, _ in after if status == 200]
    longest_gap = max(b - a for a, b in zip(stamps, stamps[1:])) if len(stamps) > 1 else float("inf")
    failed = [(round(t - killed_at, 2), status, host) for t, status, host in after if status != 200]
    print(f"\nafter the kill: {len(after)} requests, {len(failed)} failed, "
          f"longest gap between successes {longest_gap:.2f}s")
    assert not failed, f"requests failed after the agent was killed: {failed}"
    assert {host for _, _, host in after} == {SURVIVOR}

    # The dead host is excluded because NATS said so, not because its heartbeat went stale.
    assert fleet.fresh(VICTIM), "the victim's heartbeat went stale already: the test proves nothing"
    stats = client.get("/gateway/stats").json()
    print("before the kill:", [host for _, _, host in results[:REQUESTS_BEFORE_KILL]], "unroutable:",
          stats["unroutable_hosts"], "requests:", stats["requests"])
    assert [(h["host_id"], h["reason"]) for h in stats["unroutable_hosts"]] == [(VICTIM, EXCLUDED_NO_RESPONDERS)]
    assert stats["requests"].get("no_responders_retried", 0) >= 1
    metrics = client.get("/metrics").text
    assert f'grid_gateway_unroutable_hosts{{reason="{EXCLUDED_NO_RESPONDERS}"}} 1.0' in metrics

    # Restarted, the agent heartbeats again: its host is routable at once and serves again.
    fleetlib.restart_agent(fleet.home / "testfleet", VICTIM)
    wait_until("the victim routable again", lambda: not client.get("/gateway/stats").json()["unroutable_hosts"], 90)
    wait_until("the victim serving again", lambda: served_by_both("back"), 60, interval=1.0)
    metrics = client.get("/metrics").text
    assert f'grid_gateway_unroutable_hosts{{reason="{EXCLUDED_NO_RESPONDERS}"}} 0.0' in metrics
    client.close()
