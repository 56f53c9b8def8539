"""An agent killed with -9 leaves no engine behind for longer than its grace: the engine waits
that long for an agent to come back and adopt it, then the warden (grid.agent.warden) stops it
and frees its port. A graceful `gridctl node stop` leaves neither an engine nor a warden.

The agent is a real `gridctl node start` process with a real llama.cpp engine; the warden's own
rules (an agent back in time keeps the engines) are checked with real processes carrying the
owner token, as the owner-token tests do.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from grid.agent.artifacts import BUNDLED_SHA256
from grid.agent.engines.llama_cpp import port_free
from grid.agent.engines.runtime import Runtime
from grid.agent.lock import StateDirLock
from grid.agent.ownership import EngineOwner, owner_token
from grid.agent.state import AgentPaths, StateStore
from grid.agent.warden import TOKEN_ENV, WARDEN_MODULE
from grid.config import GridConfig
from grid.events.host import HostRegistered
from grid.secrets import ENGINE_SECRET_FILE, load_or_create_secret
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import host_events, make_command, seed_cache, wait_ack, wait_for
from tests.faults.agentproc import agent_env, spawn_agent
from tests.ports import engine_ports_arg

HOST = "host-orphans-1"
MODEL = "smol-orphan.gguf"
GRACE = 2.0
# The grace, the warden's poll, and a SIGTERM'd engine's exit (llama_cpp.stop_process waits 10 s
# before it SIGKILLs), with room for a busy machine.
GONE_WITHIN = GRACE + 12.0


@pytest.fixture
def grid_config(grid_home: Path, bundled_gguf: Path, engine_runtime: Runtime) -> GridConfig:
    return GridConfig(home=grid_home, nats_url=None)


def _spawn_agent(nats_url: str, home: Path, log_file: Path, *extra: str) -> subprocess.Popen[bytes]:
    return spawn_agent(nats_url, home, log_file, "--host-id", HOST, "--port-range", engine_ports_arg(), *extra)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wardens(state_dir: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if WARDEN_MODULE in argv and str(state_dir) in argv and _alive(proc.pid):
            found.append(proc.pid)
    return found


def _gone_within(pids: list[int], seconds: float) -> float | None:
    """Seconds until every pid is gone, or None when one outlived `seconds`."""
    start = time.monotonic()
    while any(_alive(pid) for pid in pids):
        if time.monotonic() - start > seconds:
            return None
        time.sleep(0.1)
    return time.monotonic() - start


async def _warm_one(js_log: JetStreamLog, agent_log: Path, paths: AgentPaths) -> tuple[int, int]:
    """Warm MODEL on the agent; the engine's pid and port."""
    await wait_for(lambda: _registered(js_log), timeout=30)
    art = dict(model_id=MODEL, artifact_sha256=BUNDLED_SHA256, memory_mb=300, host_id=HOST)
    await js_log.append(make_command("load-0", "load", **art))
    await js_log.append(make_command("warm-0", "warm", dependencies=("load-0",), **art))
    ack = await wait_ack(js_log, "warm-0", timeout=90)
    assert ack.status == "succeeded", (ack, agent_log.read_text()[-2000:])
    rec = StateStore(paths.state).load()[0].residencies[MODEL]
    assert rec.process is not None and rec.port is not None
    return rec.process.pid, rec.port


async def _registered(log: JetStreamLog) -> bool:
    return any(isinstance(e, HostRegistered) and e.host_id == HOST for e in await host_events(log))


@dataclass
class _Run:
    agent: subprocess.Popen[bytes]
    paths: AgentPaths
    log: Path
    engine_pid: int = 0


@contextlib.contextmanager
def _agent_run(nats_url: str, grid_config: GridConfig, bundled_gguf: Path, tmp_path: Path,
               *args: str) -> Iterator[_Run]:
    """A real agent with the model in its cache; it and the engine it started (`engine_pid`, set
    by the test) are killed on the way out, whatever the test left running."""
    seed_cache(grid_config, bundled_gguf, (MODEL,))
    agent_log = tmp_path / "agent.log"
    run = _Run(_spawn_agent(nats_url, grid_config.home, agent_log, *args), AgentPaths.for_config(grid_config),
               agent_log)
    try:
        yield run
    finally:
        if run.agent.poll() is None:
            run.agent.kill()
            run.agent.wait()
        if run.engine_pid and _alive(run.engine_pid):
            os.kill(run.engine_pid, signal.SIGKILL)


async def test_a_sigkilled_agents_engine_is_stopped_after_the_grace_and_its_port_freed(
        js_log: JetStreamLog, nats_server: EmbeddedNats, grid_config: GridConfig, bundled_gguf: Path,
        tmp_path: Path) -> None:
    with _agent_run(nats_server.url, grid_config, bundled_gguf, tmp_path, "--orphan-grace", f"{GRACE:g}") as run:
        agent, paths = run.agent, run.paths
        run.engine_pid, port = await _warm_one(js_log, run.log, paths)
        engine_pid = run.engine_pid
        wardens = _wardens(paths.root)
        assert len(wardens) == 1, "the first engine starts the directory's warden"

        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        killed_at = time.monotonic()
        time.sleep(GRACE / 2)
        assert _alive(engine_pid), "within the grace the engine waits for an agent to adopt it"

        took = _gone_within([engine_pid], GONE_WITHIN)
        assert took is not None, f"the engine outlived its agent by {GONE_WITHIN:.0f}s"
        assert time.monotonic() - killed_at >= GRACE
        assert port_free(port)
        assert _gone_within(wardens, 5.0) is not None, "the warden ends with the engines it stopped"
        assert "warden.stopped_orphan" in (paths.logs / "warden.log").read_text()


async def test_node_stop_drains_and_leaves_neither_engine_nor_warden(
        js_log: JetStreamLog, nats_server: EmbeddedNats, grid_config: GridConfig, bundled_gguf: Path,
        tmp_path: Path) -> None:
    with _agent_run(nats_server.url, grid_config, bundled_gguf, tmp_path) as run:
        agent, paths = run.agent, run.paths
        run.engine_pid, port = await _warm_one(js_log, run.log, paths)
        engine_pid = run.engine_pid
        wardens = _wardens(paths.root)
        assert len(wardens) == 1

        stop = subprocess.run([sys.executable, "-m", "grid.cli.node", "stop", "--timeout", "60"],
                              env=agent_env(grid_config.home), capture_output=True, text=True, timeout=90)
        assert stop.returncode == 0, stop.stderr
        assert agent.wait(timeout=10) == 0
        assert not _alive(engine_pid) and port_free(port)
        assert _gone_within(wardens, 5.0) is not None, "a warden with nothing left to watch ends at once"


@pytest.fixture
def owned_process(grid_config: GridConfig) -> Iterator[tuple[AgentPaths, str, psutil.Process]]:
    """A live process carrying this state directory's owner token (not an engine), and the token."""
    paths = AgentPaths.for_config(grid_config)
    paths.ensure()
    token = owner_token(load_or_create_secret(grid_config.home / ENGINE_SECRET_FILE), paths.root)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                            env={**os.environ, **EngineOwner(token=token, host_id=HOST).environ(100)})
    try:
        yield paths, token, psutil.Process(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def _start_warden(paths: AgentPaths, token: str, grace: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", WARDEN_MODULE, "--state-dir", str(paths.root), "--grace",
                             str(grace)], env={**os.environ, TOKEN_ENV: token}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def test_an_agent_back_within_the_grace_keeps_its_engines_and_one_gone_for_longer_loses_them(
        owned_process: tuple[AgentPaths, str, psutil.Process]) -> None:
    paths, token, owned = owned_process
    lock = StateDirLock(paths.root)
    lock.acquire()
    warden = _start_warden(paths, token, grace=1.5)
    second = None
    try:
        time.sleep(1.0)  # the warden is watching
        second = _start_warden(paths, token, grace=1.5)
        assert second.wait(timeout=10) == 0, "one warden per state directory"

        lock.release()  # the agent dies ...
        time.sleep(0.7)
        lock.acquire()  # ... and is back within the grace
        time.sleep(2.0)
        assert owned.is_running() and warden.poll() is None

        lock.release()  # gone for good this time
        assert warden.wait(timeout=15) == 0
        assert not owned.is_running() or owned.status() == psutil.STATUS_ZOMBIE
    finally:
        lock.release()
        for proc in (warden, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
