"""A two-machine test fleet (`gridctl test start --machines 2`) and one chat through its gateway,
for the fault tests that put steady load through a fleet while something fails.

Real parts: NATS with identities, the controller, the gateway, two agents that joined by
invitation, llama.cpp with the SmolLM2 GGUF.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from grid.agent.artifacts import BUNDLED_MODEL_ID
from grid.testfleet import fleet as fleetlib
from grid.testfleet.state import load_state
from tests.integration.testfleet.test_fleet_cli import gridctl, seed_fleet_models
from tests.ports import fleet_engine_port_base

MODEL = BUNDLED_MODEL_ID


@dataclass
class Fleet:
    home: Path
    gateway: str

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        state = load_state(self.home / "testfleet")
        assert state is not None
        return fleetlib.admin_request(state, method, path, body)

    def hosts(self) -> list[dict[str, Any]]:
        """The controller's view of every host (`/allocator/status`)."""
        return self.admin("GET", "/allocator/status")["hosts"]


@contextlib.contextmanager
def two_machines(home: Path, bundled_model_home: Path) -> Iterator[Fleet]:
    """A started two-machine fleet under `home` (each fleet its own engine ports, tests.ports)."""
    seed_fleet_models(home, bundled_model_home)
    try:
        started = gridctl(home, "test", "start", "--machines", "2", "--engine-port-base",
                          str(fleet_engine_port_base(2)), "--json")
        assert started.returncode == 0, started.stderr
        yield Fleet(home, json.loads(started.stdout)["gateway_url"])
    finally:
        gridctl(home, "test", "stop", timeout=180)


def ask(client: httpx.Client, stream: bool, *, affinity_key: str | None = None) -> tuple[int, str | None]:
    """One chat completion (streamed or not): (status, serving host). A cut stream is a failure
    (599), and so is a transport error (598)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Reply with OK"}], "max_tokens": 4,
            "stream": stream}
    headers = {"X-Grid-Affinity-Key": affinity_key} if affinity_key else None
    try:
        with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            content = r.read()
            if r.status_code == 200 and stream and b"[DONE]" not in content:
                return 599, r.headers.get("x-grid-host")
            return r.status_code, r.headers.get("x-grid-host")
    except httpx.HTTPError:
        return 598, None
