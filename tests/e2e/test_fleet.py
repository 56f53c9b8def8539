"""Three logical machines, each in its own network namespace (`gridctl test start --machines 3
--netns`): real NATS, controller, gateway, agents that joined by invitation, real llama.cpp, and
the official openai client.

The tests share one fleet and run in file order; each leaves the fleet as the next expects it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID
from grid.agent.engines.runtime import Runtime
from grid.agent.outcomes import NOTE_ADOPTED
from grid.agent.state import AgentPaths, decode_state
from grid.config import GridConfig
from grid.fleet import ADMITTING_HOST_STATES, HEARTBEAT_TIMEOUT_SECONDS
from grid.testfleet import fleet as fleetlib
from grid.testfleet.netns import PREFIX, existing_namespaces
from grid.testfleet.state import load_state
from tests import machine_lock
from tests.engineproc import is_engine
from tests.integration.testfleet.test_fleet_cli import gridctl, seed_fleet_models

pytestmark = pytest.mark.e2e

MODEL = BUNDLED_MODEL_ID
# h3 starts without the model: the fixture stores it in the grid's artifact store and h3's
# load fetches it from there (only h1 and h2 get a seeded cache).
PRELOAD: tuple[str, ...] = ("--preload-hosts", "2")


@dataclass
class Fleet:
    home: Path
    status: dict[str, Any]

    @property
    def root(self) -> Path:
        return self.home / "testfleet"

    @property
    def gateway(self) -> str:
        return str(self.status["gateway_url"])

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        state = load_state(self.root)
        assert state is not None
        return fleetlib.admin_request(state, method, path, body)

    def hosts(self) -> dict[str, dict[str, Any]]:
        return {h["host_id"]: h for h in self.admin("GET", "/allocator/status")["hosts"]}

    def ready(self) -> set[str]:
        """Hosts the gateway may route to: fresh, admitting, with the model READY."""
        return {h for h, row in self.hosts().items() if row["fresh"] and row["state"] in ADMITTING_HOST_STATES
                and any(r["model_id"] == MODEL and r["state"] == "ready" for r in row["residencies"])}

    def residency(self, host_id: str) -> Any:
        state = load_state(self.root)
        assert state is not None
        paths = AgentPaths.for_config(GridConfig(home=Path(state.host(host_id).home), nats_url=None))
        return decode_state(paths.state.read_bytes()).residencies.get(MODEL)

    def load_receipts(self, host_id: str) -> list[Any]:
        """The host agent's terminal outcomes of successful loads of the model (its state file)."""
        state = load_state(self.root)
        assert state is not None
        paths = AgentPaths.for_config(GridConfig(home=Path(state.host(host_id).home), nats_url=None))
        return [r for r in decode_state(paths.state.read_bytes()).receipts
                if r.kind == "load" and r.model_id == MODEL and r.status == "succeeded"]

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.gateway}/v1", api_key="unused", max_retries=0, timeout=120)


def wait_until(what: str, probe, timeout: float, interval: float = 0.5):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} within {timeout:.0f}s (last: {value!r})")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, bundled_model_home: Path, engine_runtime: Runtime) -> Iterator[Fleet]:
    home = tmp_path_factory.mktemp("fleet-home")
    seed_fleet_models(home, bundled_model_home)
    with machine_lock.turn(machine_lock.NETNS_FLEET):
        try:
            started = gridctl(home, "test", "start", "--machines", "3", "--netns", "--json", *PRELOAD, timeout=300)
            assert started.returncode == 0, started.stderr
            yield Fleet(home, json.loads(started.stdout))
        finally:
            stopped = gridctl(home, "test", "stop", timeout=240)
            assert stopped.returncode == 0, stopped.stderr
        assert not {n for n in existing_namespaces() if n.startswith(PREFIX)}, "a namespace was left behind"


async def _served_by(client: openai.AsyncOpenAI, key: str, max_tokens: int = 8) -> str:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Reply with OK"}], max_tokens=max_tokens,
        extra_headers={"X-Grid-Affinity-Key": key})
    completion = raw.parse()
    assert completion.choices[0].message.content is not None
    return raw.headers["x-grid-host"]


def test_replicas_spread_over_the_failure_domains_and_every_host_serves(fleet: Fleet) -> None:
    fleet.admin("PATCH", f"/allocator/models/{MODEL}", {
        "min_replicas": 3, "max_replicas": 3, "min_failure_domains": 3,
        "min_residency_seconds": 0.0, "scale_down_cooldown_seconds": 0.0})
    wait_until("a ready replica on each of the 3 hosts", lambda: fleet.ready() == {"h1", "h2", "h3"}, 150)
    hosts = fleet.hosts()
    assert {hosts[h]["failure_domain"] for h in ("h1", "h2", "h3")} == {"fd1", "fd2", "fd3"}
    # h3 lacked the artifact and fetched it from the grid; h1 had it cached.
    assert any(r.artifact_fetched and r.published for r in fleet.load_receipts("h3"))
    assert not any(r.artifact_fetched for r in fleet.load_receipts("h1"))

    async def spread() -> set[str]:
        seen: set[str] = set()
        async with fleet.client() as client:
            for batch in range(10):
                # Concurrent requests: each replica serves one at a time, so they fan out.
                got = await asyncio.gather(*(_served_by(client, f"user-{batch}-{i}") for i in range(3)))
                seen.update(got)
                if seen == {"h1", "h2", "h3"}:
                    break
        return seen

    assert asyncio.run(spread()) == {"h1", "h2", "h3"}


def test_engines_are_unreachable_from_outside_their_namespace(fleet: Fleet) -> None:
    state = load_state(fleet.root)
    assert state is not None
    for host in state.hosts:
        rec = fleet.residency(host.host_id)
        assert rec is not None and rec.port is not None
        assert host.netns is not None and host.address is not None
        # Inside its namespace the engine answers on loopback (the port is the right one) ...
        inside = subprocess.run(["ip", "netns", "exec", host.netns, sys.executable, "-c",
                                 f"import socket; socket.create_connection(('127.0.0.1', {rec.port}), 3)"],
                                capture_output=True, text=True, timeout=30)
        assert inside.returncode == 0, inside.stderr
        # ... from the gateway's side, neither the host's address nor loopback reaches it.
        for address in (host.address, "127.0.0.1"):
            with pytest.raises(OSError):
                socket.create_connection((address, rec.port), timeout=3).close()
    # While inference through the gateway works (the agents carry it over NATS).
    assert asyncio.run(_once(fleet)) in {"h1", "h2", "h3"}


async def _once(fleet: Fleet) -> str:
    async with fleet.client() as client:
        return await _served_by(client, "once")


def _engine_pid(fleet: Fleet, host_id: str) -> int:
    rec = fleet.residency(host_id)
    assert rec is not None and rec.process is not None
    return int(rec.process.pid)


def test_a_killed_agent_stops_receiving_requests_its_replica_is_replaced_and_restarted_it_adopts(fleet: Fleet) -> None:
    # Two replicas over three hosts: a host without one is where the replacement must go.
    fleet.admin("PATCH", f"/allocator/models/{MODEL}", {"min_replicas": 2, "max_replicas": 2, "min_failure_domains": 2})
    def two_ready() -> set[str] | None:
        ready = fleet.ready()
        return ready if len(ready) == 2 else None

    two = wait_until("exactly two ready replicas", two_ready, 120)
    victim, survivor = sorted(two)
    (spare,) = {"h1", "h2", "h3"} - two
    victim_engine = _engine_pid(fleet, victim)
    survivor_engine = _engine_pid(fleet, survivor)

    fleetlib.kill_agent(fleet.root, victim)
    killed_at = time.monotonic()
    window = HEARTBEAT_TIMEOUT_SECONDS + 5.0  # the freshness window, plus a tick and a heartbeat

    async def traffic() -> list[tuple[float, str | None]]:
        out: list[tuple[float, str | None]] = []
        async with fleet.client() as client:
            while time.monotonic() - killed_at < window + 6.0:
                try:
                    host: str | None = await _served_by(client, "steady")
                except openai.APIError:
                    host = None  # a failure before the window closes is allowed; after it, not
                out.append((time.monotonic() - killed_at, host))
                await asyncio.sleep(0.5)
        return out

    served = asyncio.run(traffic())
    late = [host for at, host in served if at > window]
    assert late and all(h is not None and h != victim for h in late), served
    # The controller replaced the replica on the host that had none (the engine of the dead
    # agent is still alive but unreachable); the survivor's replica was never touched.
    wait_until(f"a replacement on {spare}", lambda: spare in fleet.ready(), 120)
    assert survivor in fleet.ready() and _engine_pid(fleet, survivor) == survivor_engine
    assert psutil.pid_exists(victim_engine), "the killed agent's engine should outlive it"

    # Restarted, the agent adopts the engine it left running instead of starting another.
    fleetlib.restart_agent(fleet.root, victim)

    def adopted() -> bool:
        rec = fleet.residency(victim)
        return rec is not None and rec.note == NOTE_ADOPTED and rec.process is not None \
            and rec.process.pid == victim_engine

    wait_until(f"{victim} adopting engine pid {victim_engine}", adopted, 60, interval=0.1)
    wait_until(f"{victim} fresh again", lambda: fleet.hosts()[victim]["fresh"], 60)
    assert not any(is_engine(p) and p.pid != victim_engine
                   for p in psutil.Process(load_state(fleet.root).host(victim).agent.pid).children())  # type: ignore[union-attr]


async def _stream(client: openai.AsyncOpenAI, key: str, hosts: dict[str, str], started: asyncio.Event) -> str:
    """One streamed completion; returns its finish reason (raises if it was cut)."""
    async with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Count from one to fifty in words."}],
            max_tokens=200, stream=True, extra_body={"ignore_eos": True},
            extra_headers={"X-Grid-Affinity-Key": key}) as response:
        hosts[key] = response.headers["x-grid-host"]
        finish = None
        async for chunk in await response.parse():
            started.set()
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
        assert finish is not None, f"stream {key} ended without a finish reason"
        return finish


def test_draining_a_host_while_five_streams_run_aborts_none(fleet: Fleet) -> None:
    fleet.admin("PATCH", f"/allocator/models/{MODEL}", {"min_replicas": 3, "max_replicas": 3, "min_failure_domains": 3})
    wait_until("three ready replicas", lambda: fleet.ready() == {"h1", "h2", "h3"}, 150)
    state = load_state(fleet.root)
    assert state is not None

    async def run() -> tuple[list[Any], dict[str, str], str]:
        hosts: dict[str, str] = {}
        async with fleet.client() as client:
            started = asyncio.Event()
            tasks = [asyncio.create_task(_stream(client, f"s{i}", hosts, started)) for i in range(5)]
            waiter = asyncio.create_task(started.wait())
            await asyncio.wait([waiter, *tasks], timeout=90, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            assert started.is_set(), [t.exception() for t in tasks if t.done()]
            # Drain a host that is streaming right now.
            target = next(iter(hosts.values()))
            drained = await asyncio.to_thread(fleetlib.host_cli, state, target, "node", "drain")
            assert drained.returncode == 0, drained.stderr
            results = await asyncio.gather(*tasks, return_exceptions=True)
        return results, hosts, target

    results, hosts, target = asyncio.run(run())
    aborted = [r for r in results if isinstance(r, BaseException)]
    assert not aborted, aborted
    assert all(r in ("length", "stop") for r in results), results
    assert target in hosts.values()
    # The drained host takes no new request.
    wait_until(f"{target} out of routing", lambda: target not in fleet.ready(), 30)
    assert asyncio.run(_once(fleet)) != target
