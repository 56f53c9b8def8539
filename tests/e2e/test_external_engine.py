"""An engine Grid did not start, registered as inventory on a host of a test fleet (real NATS with
identities, controller, gateway, agents that joined by invitation, llama.cpp with the SmolLM2
GGUF): two machines in their own network namespaces (`--machines 2 --netns`) with the engine on
the second, inside its namespace, so the gateway's requests cross to another machine.

The test starts its own llama-server (the session's runtime, outside Grid, with its own API key),
registers it with `gridctl engine add` on that host (which holds only a host credential, so it
prints the operator's command), admits it as the operator (`gridctl engine admit` on the fleet's
control home), and checks that Grid serves it through the
gateway (chat and streaming), keeps serving it when the model's profile is retired, the host is
drained and the agent is killed and restarted, never signals it (same pid, alive), and stops
routing to it within 5 s of its death, with status saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID
from grid.agent.engines.runtime import Runtime
from grid.agent.ownership import HOST_ENV, OWNER_ENV
from grid.fleet import ADMITTING_HOST_STATES
from grid.testfleet import fleet as fleetlib
from grid.testfleet import netns
from grid.testfleet.state import load_state
from grid.transport.embedded import free_port
from tests.integration.testfleet.test_fleet_cli import gridctl, seed_fleet_models
from tests import machine_lock
from tests.ports import fleet_engine_port_base

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.slow]

MODEL = BUNDLED_MODEL_ID


def wait_until(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass
class EngineHost:
    """A test fleet and the host (its last) where the external engine runs."""

    home: Path
    gateway: str

    @property
    def root(self) -> Path:
        return self.home / "testfleet"

    def _record(self) -> Any:
        state = load_state(self.root)
        assert state is not None
        return state.hosts[-1]

    @property
    def host_id(self) -> str:
        return str(self._record().host_id)

    @property
    def netns(self) -> str | None:
        return self._record().netns

    def inside(self, argv: list[str]) -> list[str]:
        """`argv` run on the engine's machine (inside its namespace, when it has one)."""
        return [*netns.exec_prefix(self.netns), *argv]

    @property
    def agent_state_dir(self) -> Path:
        return Path(self._record().home) / "agent"

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        state = load_state(self.root)
        assert state is not None
        return fleetlib.admin_request(state, method, path, body)

    def admit(self, request: str) -> subprocess.CompletedProcess[str]:
        """The operator runs the `gridctl engine admit ...` command the host printed, with the
        fleet's operator credential (its control home), on the controller's machine."""
        state = load_state(self.root)
        assert state is not None
        env = {k: v for k, v in os.environ.items() if k not in ("GRID_NATS_URL", "GRID_AGENT_STATE_DIR")} | {
            "GRID_HOME": str(self.root / "control"), "COLUMNS": "400"}
        return subprocess.run([sys.executable, "-m", "grid.cli.main", *request.split()[1:], "--nats", state.nats_url],
                              env=env, capture_output=True, text=True, timeout=60)

    def host(self) -> dict[str, Any]:
        return next(h for h in self.admin("GET", "/allocator/status")["hosts"] if h["host_id"] == self.host_id)

    def engine(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`gridctl engine ...` on the engine's machine (its probe reaches the engine's loopback)."""
        env = {k: v for k, v in os.environ.items() if k != "GRID_NATS_URL"} | {"GRID_HOME": str(self.home),
                                                                              "COLUMNS": "400"}
        return subprocess.run(self.inside([sys.executable, "-m", "grid.cli.main", "engine", *args, "--state-dir",
                                           str(self.agent_state_dir)]),
                              env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def fleet(tmp_path: Path, bundled_model_home: Path, engine_runtime: Runtime) -> Iterator[EngineHost]:
    home = tmp_path / "home"
    seed_fleet_models(home, bundled_model_home)
    ours: set[str] = set()
    with machine_lock.turn(machine_lock.NETNS_FLEET):
        try:
            started = gridctl(home, "test", "start", "--machines", "2", "--netns", "--engine-port-base",
                              str(fleet_engine_port_base(2)), "--json", timeout=300)
            assert started.returncode == 0, started.stderr
            state = load_state(home / "testfleet")
            assert state is not None
            ours = {h.netns for h in state.hosts if h.netns}
            yield EngineHost(home, json.loads(started.stdout)["gateway_url"])
        finally:
            stopped = gridctl(home, "test", "stop", timeout=240)
            assert stopped.returncode == 0, stopped.stderr
            assert not ours & set(netns.existing_namespaces()), "a namespace of this fleet was left behind"


@dataclass
class ExternalEngine:
    proc: subprocess.Popen[bytes]
    url: str
    key_file: Path

    def alive_and_unsignalled(self) -> bool:
        """Still the process the test started: running, same pid, not a zombie."""
        if self.proc.poll() is not None:
            return False
        p = psutil.Process(self.proc.pid)
        return p.status() != psutil.STATUS_ZOMBIE


@pytest.fixture
def external_engine(fleet: EngineHost, tmp_path: Path, bundled_gguf: Path,
                    engine_runtime: Runtime) -> Iterator[ExternalEngine]:
    """A llama-server started by hand on the fleet's engine host (no Grid owner marker in its
    environment), with an API key."""
    key_file = tmp_path / "external.key"
    key_file.write_text("sk-external-test-key\n")
    key_file.chmod(0o600)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in (OWNER_ENV, HOST_ENV)}
    log = (tmp_path / "external-engine.log").open("wb")
    # `ip netns exec` enters the namespace and execs the server: the pid is the server's.
    proc = subprocess.Popen(fleet.inside(
        [*engine_runtime.command, "--model", str(bundled_gguf), "--host", "127.0.0.1", "--port", str(port),
         "--api-key-file", str(key_file), "--alias", MODEL, "--ctx-size", "1024", "--parallel", "2",
         "--threads", "1", "--no-webui"]),
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    engine = ExternalEngine(proc, f"http://127.0.0.1:{port}", key_file)
    try:
        def healthy() -> bool:
            assert proc.poll() is None, (tmp_path / "external-engine.log").read_text()[-2000:]
            probe = subprocess.run(fleet.inside([sys.executable, "-c", HEALTH_CHECK, engine.url + "/health"]),
                                   capture_output=True, timeout=30)
            return probe.returncode == 0

        wait_until("the external llama-server to be healthy", healthy, 120)
        yield engine
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        log.close()


# Run on the engine's machine: exit 0 when the URL answers 200.
HEALTH_CHECK = (
    "import sys, httpx\n"
    "try:\n    sys.exit(0 if httpx.get(sys.argv[1], timeout=1, trust_env=False).status_code == 200 else 1)\n"
    "except httpx.HTTPError:\n    sys.exit(1)\n"
)


def chat(gateway: str, stream: bool) -> tuple[int, str | None, bytes]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Reply with OK"}], "max_tokens": 4,
            "stream": stream}
    with httpx.Client(base_url=gateway, timeout=60, trust_env=False) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            return r.status_code, r.headers.get("x-grid-host"), r.read()


def served_by_external(fleet: EngineHost) -> None:
    """A plain and a streamed chat through the gateway, both answered by the host."""
    status, host, body = chat(fleet.gateway, stream=False)
    assert status == 200, body
    assert host == fleet.host_id
    assert json.loads(body)["choices"][0]["message"]["content"] is not None
    status, host, body = chat(fleet.gateway, stream=True)
    assert status == 200, body
    assert host == fleet.host_id and b"[DONE]" in body


def residency(fleet: EngineHost, managed: bool) -> dict[str, Any] | None:
    return next((r for r in fleet.host()["residencies"] if r["model_id"] == MODEL and r["managed"] == managed), None)


def managed_copies(fleet: EngineHost) -> dict[str, str]:
    """Grid's own copies of the model that hold an engine, on any host of the fleet: host -> state."""
    return {h["host_id"]: r["state"] for h in fleet.admin("GET", "/allocator/status")["hosts"]
            for r in h["residencies"] if r["model_id"] == MODEL and r["managed"] and r["state"] != "cached"}


def grid_engines(fleet: EngineHost) -> list[int]:
    """Engines Grid spawned for the fleet's engine host: they carry its owner marker, and their key
    file lies in this fleet's home (another test's fleet may name a host the same)."""
    out = []
    for p in psutil.process_iter():
        try:
            env, argv = p.environ(), p.cmdline()
        except psutil.Error:
            continue
        if OWNER_ENV in env and env.get(HOST_ENV) == fleet.host_id and any(str(fleet.home) in a for a in argv):
            out.append(p.pid)
    return out


def test_external_engine_is_served_never_actuated_and_unroutable_once_dead(
    fleet: EngineHost, external_engine: ExternalEngine, tmp_path: Path,
) -> None:
    engine = external_engine
    pid = engine.proc.pid

    # Registration probes at once: a wrong key and an unlisted model are refused, clearly.
    wrong_key = tmp_path / "wrong.key"
    wrong_key.write_text("sk-wrong\n")
    wrong_key.chmod(0o600)
    refused = fleet.engine("add", engine.url, "--model", MODEL, "--kind", "llama.cpp",
                           "--api-key-file", str(wrong_key))
    assert refused.returncode == 1 and "api_key_refused" in refused.stderr, refused.stderr
    assert "sk-wrong" not in refused.stderr + refused.stdout
    refused = fleet.engine("add", engine.url, "--model", "not-served", "--kind", "llama.cpp",
                           "--api-key-file", str(engine.key_file))
    assert refused.returncode == 1 and "model_not_listed" in refused.stderr and MODEL in refused.stderr
    assert json.loads(fleet.engine("ls", "--json").stdout) == {"engines": []}

    added = fleet.engine("add", engine.url + "/v1", "--model", MODEL, "--kind", "llama.cpp", "--memory-mb", "250",
                         "--api-key-file", str(engine.key_file))
    assert added.returncode == 0, added.stderr
    # The host only requests the route; the operator admits it (a signed event on the control stream).
    request = next(line.strip() for line in added.stdout.splitlines()
                   if line.strip().startswith("gridctl engine admit"))
    assert request.split()[3:5] == [fleet.host_id, MODEL], request
    admitted = fleet.admit(request)
    assert admitted.returncode == 0, admitted.stderr + admitted.stdout
    (listed,) = json.loads(fleet.engine("ls", "--json").stdout)["engines"]
    assert (listed["url"], listed["probe"], listed["memory_mb"]) == (engine.url, "ok", 250)

    # Status shows it as external, ready, with its memory; the key is in no event or log.
    ext = wait_until("the external residency in status", lambda: (r := residency(fleet, False)) and
                     r["state"] == "ready" and r, 30)
    assert ext["memory_mb"] == 250

    # Migration to managed: the operator retires the external route; the planner, which counted
    # the external engine toward the model's replicas, has Grid's own replica serve it again,
    # and the engine is left running.
    removed = fleet.engine("rm", MODEL)
    assert removed.returncode == 0, removed.stderr
    retired_at = time.monotonic()
    wait_until("the external route gone from status", lambda: residency(fleet, False) is None, 15)
    wait_until("a managed replica serving the model", lambda: chat(fleet.gateway, stream=False)[0] == 200, 90,
               interval=0.5)
    print(f"managed replica serving {time.monotonic() - retired_at:.1f}s after the external route was retired")
    assert engine.alive_and_unsignalled() and engine.proc.pid == pid
    # ...and brought back for the rest of the test.
    added = fleet.engine("add", engine.url, "--model", MODEL, "--kind", "llama.cpp", "--memory-mb", "250",
                         "--api-key-file", str(engine.key_file))
    assert added.returncode == 0, added.stderr
    wait_until("the external residency back", lambda: (r := residency(fleet, False)) and r["state"] == "ready", 15)

    # Retire the profile: Grid drains its own copy to zero, the external engine keeps serving.
    fleet.admin("DELETE", f"/allocator/models/{MODEL}")
    # Every copy: the other machine's too, which stays routable until its drain is acknowledged
    # (a CI run checked only this host's, and the other machine answered the next request).
    wait_until("every managed copy drained", lambda: not managed_copies(fleet), 120)
    wait_until("no Grid engine left on the host", lambda: not grid_engines(fleet), 60)
    served_by_external(fleet)
    assert engine.alive_and_unsignalled() and engine.proc.pid == pid

    # Drain the host: the reconciler drains what it owns; an external engine is never drained.
    drained = gridctl(fleet.home, "node", "drain", "--reason", "maintenance",
                      "--state-dir", str(fleet.agent_state_dir))
    assert drained.returncode == 0, drained.stderr
    wait_until("the host draining", lambda: fleet.host()["state"] == "draining", 30)
    served_by_external(fleet)
    assert residency(fleet, False)["state"] == "ready"
    assert engine.alive_and_unsignalled() and engine.proc.pid == pid
    resumed = gridctl(fleet.home, "node", "resume", "--state-dir", str(fleet.agent_state_dir))
    assert resumed.returncode == 0, resumed.stderr

    # Stop the agent (a graceful stop drains and stops every child it owns) and kill it; each
    # time it starts again from the registration on disk, and the engine is untouched.
    for how in ("stop", "kill"):
        if how == "stop":
            stopped = gridctl(fleet.home, "node", "stop", "--state-dir", str(fleet.agent_state_dir))
            assert stopped.returncode == 0, stopped.stderr
        else:
            fleetlib.kill_agent(fleet.root, fleet.host_id)
        assert engine.alive_and_unsignalled() and engine.proc.pid == pid
        fleetlib.restart_agent(fleet.root, fleet.host_id)
        wait_until(f"the agent reporting after its {how}", lambda: fleet.host()["fresh"]
                   and fleet.host()["state"] in ADMITTING_HOST_STATES and (r := residency(fleet, False))
                   and r["state"] == "ready", 60)
        wait_until("the gateway routing to it again", lambda: chat(fleet.gateway, stream=False)[0] == 200, 30)
        served_by_external(fleet)
        assert engine.alive_and_unsignalled() and engine.proc.pid == pid
        assert not grid_engines(fleet)

    # Death: unroutable within 5 s, and status says why.
    engine.proc.kill()
    died = time.monotonic()
    engine.proc.wait(timeout=10)
    # Until the probe notices, a request may still reach the agent and fail to connect (502);
    # unroutable means the gateway no longer sends it anywhere (no ready replica).
    wait_until("the gateway to stop routing to the dead engine",
               lambda: chat(fleet.gateway, stream=False)[0] in (404, 503), 5.0, interval=0.1)
    unroutable_after = time.monotonic() - died
    assert unroutable_after < 5.0
    print(f"dead external engine unroutable after {unroutable_after:.2f}s")
    status, _, body = chat(fleet.gateway, stream=False)
    assert status in (404, 503), body
    wait_until("status to say why", lambda: residency(fleet, False) is not None
               and residency(fleet, False)["state"] == "failed", 10)
    warnings = fleet.host()["warnings"]
    assert any(w.startswith(f"external_engine_unreachable: {MODEL} at {engine.url}") for w in warnings), warnings

    # The key is on no event and in no log; the heartbeats carried the engine as external.
    state = load_state(fleet.root)
    assert state is not None
    exported = subprocess.run(
        [sys.executable, "-m", "grid.cli.main", "events", "export", "--stream", "hosts", "--nats", state.nats_url],
        env={k: v for k, v in os.environ.items() if k not in ("GRID_NATS_URL", "GRID_AGENT_STATE_DIR")}
        | {"GRID_HOME": str(fleet.root / "control")}, capture_output=True, text=True, timeout=120)
    assert exported.returncode == 0, exported.stderr
    assert f'"endpoint":"{engine.url}"' in exported.stdout.replace('\\"', '"').replace(" ", "")
    for text in (exported.stdout, *(f.read_text(errors="replace") for f in (fleet.root / "logs").glob("*.log"))):
        assert "sk-external-test-key" not in text
