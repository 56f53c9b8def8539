"""`gridctl test start` with GRID_GATEWAY_API_KEYS set: the fleet's gateway requires client keys,
and the start's own check of it (`/v1/models`) uses a key from that variable instead of failing
on the 401 every keyless request gets. Real processes on loopback (NATS, controller, gateway, an
agent that joins by invitation); a variable the gateway could not read is refused before anything
starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grid.agent.engines.runtime import Runtime
from tests.integration.testfleet.test_fleet_cli import seed_fleet_models
from tests.ports import fleet_engine_port_base

pytestmark = [pytest.mark.integration, pytest.mark.engine]

KEYS = ("sk-fleet-first", "sk-fleet-second")


def _gridctl(home: Path, keys: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GRID_NATS_URL"} | {
        "GRID_HOME": str(home), "GRID_GATEWAY_API_KEYS": keys, "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "grid.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.keys"
    path.write_text("# the fleet's client keys\n" + "\n".join(KEYS) + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def home(tmp_path: Path, key_file: Path, bundled_model_home: Path, engine_runtime: Runtime) -> Iterator[Path]:
    home = tmp_path / "home"
    seed_fleet_models(home, bundled_model_home)
    try:
        yield home
    finally:
        stopped = _gridctl(home, str(key_file), "test", "stop", timeout=180)
        assert stopped.returncode == 0, stopped.stderr


def test_test_start_checks_a_keyed_gateway_with_a_key_from_the_variable(home: Path, key_file: Path) -> None:
    started = _gridctl(home, str(key_file), "test", "start", "--machines", "1", "--no-wait", "--engine-port-base",
                       str(fleet_engine_port_base(1)), "--json")
    assert started.returncode == 0, started.stderr[-3000:]
    gateway = json.loads(started.stdout)["gateway_url"]
    # The gateway does require a key, and takes the fleet's.
    assert httpx.get(gateway + "/v1/models", timeout=10, trust_env=False).status_code == 401
    for key in KEYS:
        answer = httpx.get(gateway + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10,
                           trust_env=False)
        assert answer.status_code == 200, answer.text
    assert not any(key in started.stdout + started.stderr for key in KEYS)  # never printed


def test_a_variable_the_gateway_cannot_read_is_refused_before_anything_starts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    missing = tmp_path / "no-such" / "gateway.keys"
    started = _gridctl(home, str(missing), "test", "start", "--machines", "1", timeout=120)
    assert started.returncode == 1, started.stderr
    message = " ".join(started.stderr.split())
    assert "GRID_GATEWAY_API_KEYS" in message and str(missing) in message, message
    assert not (home / "testfleet" / "fleet.json").exists()
