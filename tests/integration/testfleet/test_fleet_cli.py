"""`gridctl test start|status|watch|stop` with real processes on loopback: real NATS (secured),
controller, gateway, agents that join through real invitations, and llama.cpp children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID
from grid.agent.engines.runtime import Runtime
from tests.engineproc import is_engine
from tests.ports import fleet_engine_port_base

pytestmark = pytest.mark.engine


def gridctl(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GRID_NATS_URL"} | {"GRID_HOME": str(home), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "grid.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def seed_fleet_models(home: Path, bundled_model_home: Path) -> None:
    """The fleet's model cache, seeded from the session's verified copy (no second download)."""
    from grid.agent.artifacts import BUNDLED_SHA256, ArtifactCache
    from grid.config import GridConfig
    from tests.integration.agent.agentkit import seed_cache

    seed_cache(GridConfig(home=home / "testfleet" / "models", nats_url=None),
               ArtifactCache(bundled_model_home / "artifacts").blob_path(BUNDLED_SHA256))


@pytest.fixture
def home(tmp_path: Path, bundled_model_home: Path, engine_runtime: Runtime) -> Iterator[Path]:
    home = tmp_path / "home"
    seed_fleet_models(home, bundled_model_home)
    try:
        yield home
    finally:
        gridctl(home, "test", "stop", timeout=180)


def _status(home: Path) -> dict:  # type: ignore[type-arg]
    done = gridctl(home, "test", "status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _pids(status: dict) -> dict[str, int]:  # type: ignore[type-arg]
    return {name: p["pid"] for name, p in status["processes"].items()}


def test_start_status_watch_idempotent_start_and_stop(home: Path) -> None:
    settings = ("--machines", "2", "--capacities-gib", "1,1.5", "--engine-port-base", str(fleet_engine_port_base(2)))
    started = gridctl(home, "test", "start", *settings, "--json")
    assert started.returncode == 0, started.stderr
    assert "starting NATS JetStream" in started.stderr and "waiting for" in started.stderr  # progress
    status = json.loads(started.stdout)
    assert status["nats_url"].startswith("nats://127.0.0.1:")
    hosts = {h["host_id"]: h for h in status["hosts"]}
    assert set(hosts) == {"h1", "h2"}
    assert {h["failure_domain"] for h in hosts.values()} == {"fd1", "fd2"}
    assert [hosts["h1"]["capacity_mb"], hosts["h2"]["capacity_mb"]] == [1024, 1536]
    r1, r2 = hosts["h1"]["port_range"], hosts["h2"]["port_range"]
    assert r1[1] < r2[0], "engine port ranges overlap"
    assert all(p["running"] for p in status["processes"].values()), status["processes"]
    assert all(h["fresh"] for h in hosts.values())
    for h in hosts.values():
        # Its own grid home and state, and a credential from the real invite/join flow.
        enrolment = json.loads((Path(h["home"]) / "agent" / "identity" / "enrolment.json").read_text())
        assert enrolment["host_id"] == h["host_id"]
        assert Path(enrolment["creds_path"]).is_file()
    # The shares sit in one machine ledger: what the hosts claim is what they were given.
    claims = [json.loads(p.read_text()) for p in (home / "testfleet" / "shares").glob("*.json")]
    assert sorted(c["memory_mb"] for c in claims) == [1024, 1536]
    admin = status["admin_url"]
    token = Path(status["operator_token_file"]).read_text().strip()
    seen = httpx.get(f"{admin}/allocator/status", headers={"X-Grid-Allocator-Token": token}, timeout=5).json()
    assert sorted(h["capacity_mb"] for h in seen["hosts"]) == [1024, 1536]
    # Hardware per host, from the agents' own signed heartbeats (this machine has no GPU).
    for h in seen["hosts"]:
        hw = h["hardware"]
        assert (hw["accelerator"], hw["placement_memory"], hw["devices"], hw["vram_total_mb"]) == ("cpu", "ram", [], None)
        assert hw["cpu_count"] > 0 and hw["ram_mb"] == h["capacity_mb"] and hw["disk_total_bytes"] > 0
        assert [(r["runtime"], r["backends"]) for r in hw["runtimes"]] == [("llama.cpp", ["cpu"])]
    table = gridctl(home, "status", "--admin", admin, "--token-file", status["operator_token_file"])
    assert table.returncode == 0 and "Hardware" in table.stdout and "accelerator" in table.stdout, table.stderr

    # The same start again is a no-op; other settings are refused and touch nothing.
    again = gridctl(home, "test", "start", *settings)
    assert again.returncode == 0 and "already running" in again.stderr, again.stderr
    other = gridctl(home, "test", "start", "--machines", "3")
    assert other.returncode == 1 and "other settings" in other.stderr, other.stderr
    assert _pids(_status(home)) == _pids(status)

    # watch follows a residency transition and the command outcome a profile change causes.
    env = {k: v for k, v in os.environ.items() if k != "GRID_NATS_URL"} | {"GRID_HOME": str(home)}
    watcher = subprocess.Popen([sys.executable, "-m", "grid.cli.main", "test", "watch"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(watcher.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        # Subscribed: the first heartbeats show where each host stands.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(" -> " in line for line in lines):
            time.sleep(0.2)
        assert any(" -> " in line for line in lines), lines
        # A profile change that needs a command after watch subscribed: a second replica, or,
        # where the fleet already placed two (a slow start can finish both loads before watch
        # subscribes), one fewer. A load still in flight ends after the subscription either way.
        replicas = 1 if len(_ready(home)) == 2 else 2
        resp = httpx.patch(f"{admin}/allocator/models/{BUNDLED_MODEL_ID}", headers={"X-Grid-Allocator-Token": token},
                           json={"min_replicas": replicas, "max_replicas": replicas}, timeout=5)
        assert resp.status_code == 200, resp.text
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(_ready(home)) != replicas:
            time.sleep(0.5)
        assert len(_ready(home)) == replicas
        # watch prints what the log says, a moment after the log says it: wait for its lines.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not ("-> ready" in "".join(lines) and "succeeded" in "".join(lines)):
            time.sleep(0.2)
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.wait(timeout=30)
        reader.join(timeout=10)
    out = "".join(lines)
    assert "-> ready" in out, out
    assert "succeeded" in out, out

    procs = _pids(_status(home))
    engines = [c for p in procs.values() for c in psutil.Process(p).children(recursive=True) if is_engine(c)]
    assert len(engines) >= replicas  # a drained one may still be on its way out: stop ends it too
    stopped = gridctl(home, "test", "stop", timeout=180)
    assert stopped.returncode == 0, stopped.stderr
    assert not (home / "testfleet" / "fleet.json").exists()
    for pid in [*procs.values(), *(e.pid for e in engines)]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
    assert gridctl(home, "test", "status").stdout.startswith("no test fleet")

    # A new fleet in the same home: its host joins this fleet's NATS, not the stopped one's.
    again = gridctl(home, "test", "start", "--machines", "1", "--engine-port-base", str(fleet_engine_port_base(1)),
                    "--json")
    try:
        assert again.returncode == 0, again.stderr
        (host,) = json.loads(again.stdout)["hosts"]
        assert host["host_id"] == "h1" and host["fresh"], host
    finally:
        stopped = gridctl(home, "test", "stop", timeout=180)
        assert stopped.returncode == 0, stopped.stderr


def _ready(home: Path) -> list[str]:
    return [h["host_id"] for h in _status(home)["hosts"]
            if any(r["state"] == "ready" for r in h["residencies"])]


def test_a_damaged_state_file_is_a_clear_error_and_nothing_is_signalled(tmp_path: Path) -> None:
    state = tmp_path / "testfleet" / "fleet.json"
    state.parent.mkdir(parents=True)
    state.write_text('{"settings": {"machines": 3, ')
    for args in (("test", "status"), ("test", "stop"), ("test", "watch"), ("test", "start", "--machines", "1")):
        done = gridctl(tmp_path, *args, timeout=60)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert "damaged" in done.stderr and str(state) in done.stderr, done.stderr
    assert state.read_text() == '{"settings": {"machines": 3, '


def test_settings_that_do_not_fit_are_refused_before_anything_starts(tmp_path: Path, bundled_model_home: Path) -> None:
    from grid.testfleet.fleet import machine_memory_mb

    seed_fleet_models(tmp_path, bundled_model_home)
    too_much = f"{machine_memory_mb() / 1024:.0f},{machine_memory_mb() / 1024:.0f}"
    cases = [
        (("--machines", "2", "--capacities-gib", too_much), "never multiply"),
        (("--machines", "2", "--capacities-gib", "1,1,1"), "one per machine"),
        (("--machines", "0"), "--machines must be"),
        (("--machines", "2", "--capacities-gib", "0.25,1"), "less than one replica"),
        (("--machines", "2", "--capacities-gib", "a,b"), "--capacities-gib"),
        (("--machines", "1", "--model", str(tmp_path / "missing.gguf")), "no such file"),
    ]
    for args, message in cases:
        done = gridctl(tmp_path, "test", "start", *args, timeout=120)
        assert done.returncode == 1 and message in done.stderr, (args, done.stderr)
    assert not (tmp_path / "testfleet" / "fleet.json").exists()
