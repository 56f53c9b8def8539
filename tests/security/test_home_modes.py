"""Everything under GRID_HOME is owner-only: directories 0700, files 0600.

A probe found the DuckDB store and its WAL, nats-server's log and the engines' logs created 0644,
and an existing home left 0755. Each test below makes those files the way `gridctl up` does, with
the real part that writes them (nats-server, DuckDB through the analytics service, an engine
child through the agent's launcher), under a umask of 022 so the defaults would show, and walks
the whole home afterwards.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from grid.agent.engines import llama_cpp
from grid.agent.engines.runtime import xllamacpp_runtime
from grid.agent.state import AgentPaths
from grid.analytics.service import AnalyticsService
from grid.config import GridConfig
from grid.events.subjects import escape_token
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.local import authority_dir, ensure_local_credentials
from grid.identity.server import SecuredEmbeddedNats
from grid.secrets import SecretFileError, open_owner_only, read_secret, write_owner_only
from grid.transport.embedded import free_port
from grid.transport.jetstream import JetStreamLog
from tests.security.conftest import event, host_ingress

HOST = "local"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def open_to_others(root: Path) -> list[str]:
    """Every directory or file at or under `root` that group or others may use, with its mode."""
    found = [f"{root} {mode(root):o}"] if mode(root) & 0o077 else []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = Path(dirpath, name)
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                found.append(f"{path} {stat.S_IMODE(st.st_mode):o}")
    return found


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The common umask 022, so a file made with default modes is 0644 here whatever CI's is."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def wide_home(tmp_path: Path) -> Path:
    """A grid home that already exists at 0755, as `mkdir ~/.grid` leaves it."""
    home = tmp_path / "grid-home"
    home.mkdir()
    home.chmod(0o755)
    assert mode(home) == 0o755
    return home


def test_an_existing_home_at_0755_becomes_0700(wide_home: Path) -> None:
    GridConfig(home=wide_home, nats_url=None).ensure_home()
    assert mode(wide_home) == 0o700
    assert open_to_others(wide_home) == []


def test_a_new_home_and_its_missing_parents_are_made_0700(tmp_path: Path) -> None:
    home = tmp_path / "a" / "b" / "grid-home"
    GridConfig(home=home, nats_url=None).ensure_home()
    assert [mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", home)] == [0o700] * 3


def test_a_wide_home_and_what_is_in_it_are_tightened_with_a_warning(wide_home: Path) -> None:
    (wide_home / "nats").mkdir(mode=0o755)
    old_store = wide_home / "analytics.duckdb"  # as an older Grid left it
    old_store.write_bytes(b"not really a store")
    old_store.chmod(0o644)
    old_log = wide_home / "nats" / "nats-server.log"
    old_log.write_bytes(b"[1] server started\n")
    old_log.chmod(0o640)
    # A token others could read may have leaked already: it is not quietly tightened, its reader
    # refuses it and names the fix (as `gridctl up` does before it starts anything).
    token = wide_home / "operator.token"
    token.write_text("0123456789abcdef\n")
    token.chmod(0o644)

    with capture_logs() as logs:
        GridConfig(home=wide_home, nats_url=None).ensure_home()

    assert (mode(wide_home), mode(wide_home / "nats")) == (0o700, 0o700)
    assert (mode(old_store), mode(old_log)) == (0o600, 0o600)
    assert old_store.read_bytes() == b"not really a store"  # tightened, not replaced
    warned = {(entry["path"], entry["old_mode"]) for entry in logs if entry["log_level"] == "warning"}
    assert warned == {(str(wide_home), "755"), (str(wide_home / "nats"), "755"),
                      (str(old_store), "644"), (str(old_log), "640")}
    assert mode(token) == 0o644
    with pytest.raises(SecretFileError, match="chmod 600"):
        read_secret(token)
    assert open_to_others(wide_home) == [f"{token} 644"]


# Run as root, the child gives up CAP_FOWNER (its bounding set, before exec): like any user, it
# may then change the mode only of what it owns.
WITHOUT_FOWNER = (
    "import ctypes, os, sys\n"
    "assert ctypes.CDLL(None, use_errno=True).prctl(24, 3, 0, 0, 0) == 0  # PR_CAPBSET_DROP, CAP_FOWNER\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)


def test_a_home_we_cannot_tighten_is_refused_with_the_path_and_the_fix(tmp_path: Path) -> None:
    """`gridctl up` on a wide home another user owns: a one-line refusal, nothing started."""
    if os.geteuid() == 0:
        home = tmp_path / "grid-home"
        home.mkdir()
        home.chmod(0o755)
        os.chown(home, 65534, 65534)  # nobody's
        launcher = [sys.executable, "-c", WITHOUT_FOWNER]
    else:
        home = Path("/tmp")  # root's, 1777: an unprivileged user cannot change it
        launcher = [sys.executable]
    assert os.stat(home).st_uid != os.geteuid() and mode(home) & 0o077
    before = mode(home)
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "300"}
    for name in ("GRID_NATS_URL", "GRID_ALLOCATOR_CONTROL_TOKEN", "GRID_ALLOCATOR_TOKEN_FILE"):
        env.pop(name, None)
    result = subprocess.run([*launcher, "-m", "grid.cli.main", "up", "--port", "0", "--no-wait"], env=env,
                            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    flat = " ".join(result.stderr.split())  # rich wraps long lines
    assert f"{home} is open to other users (mode {before:o})" in flat, result.stderr
    assert f"chmod 700 {home}" in flat, result.stderr
    assert mode(home) == before
    if os.geteuid() == 0:
        assert list(home.iterdir()) == []  # refused before anything was made


def test_opening_an_old_wide_log_tightens_it_with_a_warning(tmp_path: Path) -> None:
    log_path = tmp_path / "engine.log"
    log_path.write_bytes(b"old line\n")
    log_path.chmod(0o644)
    with capture_logs() as logs, open_owner_only(log_path, "ab") as out:
        out.write(b"new line\n")
    assert mode(log_path) == 0o600 and log_path.read_bytes() == b"old line\nnew line\n"
    assert [(e["path"], e["old_mode"]) for e in logs] == [(str(log_path), "644")]
    fresh = tmp_path / "fresh.log"
    with capture_logs() as logs, open_owner_only(fresh, "ab"):
        pass
    assert mode(fresh) == 0o600 and logs == []  # a file made owner-only is nothing to warn about


async def test_nats_server_log_store_and_the_analytics_store_are_owner_only(wide_home: Path) -> None:
    """What `gridctl up` starts first (grid.localgrid): the home, the credentials, the secured
    embedded nats-server, then the controller's analytics service following the log."""
    cfg = GridConfig(home=wide_home, nats_url=None)
    cfg.ensure_home()
    local = ensure_local_credentials(cfg.home, host_ids=[HOST], now=time.time())
    server = SecuredEmbeddedNats(cfg.nats_store_dir, Authority(authority_dir(cfg.home)))
    server.start()
    try:
        write_owner_only(cfg.nats_url_file, (server.url + "\n").encode())
        assert server.log_path.stat().st_size > 0  # the server itself wrote it
        assert mode(server.log_path) == 0o600
        controller = await connect_log(server.url, credentials=local.controller, name="grid-controller")
        agent = await connect_log(server.url, credentials=local.hosts[HOST], ensure_streams=False)
        analytics = AnalyticsService(controller, cfg.duckdb_path, flush_seconds=0.05)
        await analytics.start()
        try:
            wal = cfg.duckdb_path.with_name(cfg.duckdb_path.name + ".wal")
            async with host_ingress(controller):  # a host's appends are stored through it
                for _ in range(2):
                    done = await agent.append(event("host.heartbeat.v1", host_id=HOST))
                    assert await analytics.flushed({done.stream: done.seq})
                    # The rows are visible at COMMIT; the sink tightens the WAL DuckDB just made right
                    # after, then records the positions as committed: wait for that, not the query.
                    deadline = time.monotonic() + 5
                    while analytics.stored_positions().get(done.stream, 0) < done.seq:
                        assert time.monotonic() < deadline, "the commit's positions were never recorded"
                        await asyncio.sleep(0.01)
                    assert analytics.sink is not None and analytics.sink.rows_written >= 1
                    assert wal.exists(), "the commit left no WAL: nothing about its mode was tested"
                    assert (mode(cfg.duckdb_path), mode(wal)) == (0o600, 0o600)
                    # A checkpoint deletes the WAL and the next commit makes a new one: owner-only too.
                    assert analytics.con is not None
                    analytics.con.cursor().execute("CHECKPOINT")
                    assert not wal.exists()
            # JetStream made its store (0750/0640 by default) while the grid ran.
            assert list((cfg.nats_store_dir / "jetstream").rglob("*"))
            assert open_to_others(cfg.home) == []
        finally:
            await analytics.stop()
            await agent.close()
            await controller.close()
    finally:
        server.stop()
    assert open_to_others(cfg.home) == []


@pytest.mark.parametrize("runtime", [pytest.param("llama-server", marks=pytest.mark.native), "xllamacpp"])
def test_an_engine_log_made_by_the_agents_launcher_is_owner_only(
        wide_home: Path, runtime: str, request: pytest.FixtureRequest) -> None:
    """The agent's own launch path (grid.agent.actuators -> llama_cpp.spawn) with a real child.
    The model is missing, so the child writes its complaint to the log and exits at once."""
    binary = (request.getfixturevalue("native_llama_server") if runtime == "llama-server"
              else list(xllamacpp_runtime().command))
    cfg = GridConfig(home=wide_home, nats_url=None)
    cfg.ensure_home()
    paths = AgentPaths.for_config(cfg)
    paths.ensure()
    write_owner_only(paths.engine_key, b"engine-key-1\n")
    port = free_port()
    spec = llama_cpp.EngineSpec(model_id="SmolLM2.gguf", model_path=wide_home / "missing.gguf", port=port,
                                key_file=paths.engine_key, threads=1, context_size=256)
    log_path = paths.logs / f"{escape_token(spec.model_id)}-{port}.log"
    child = llama_cpp.spawn(binary, spec, log_path)
    try:
        assert child.wait(timeout=120) != 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert log_path.stat().st_size > 0, "the engine wrote nothing: its log was not exercised"
    assert mode(log_path) == 0o600
    assert (mode(paths.root), mode(paths.logs)) == (0o700, 0o700)
    assert open_to_others(cfg.home) == []


async def test_the_hardware_file_an_agent_writes_is_owner_only(wide_home: Path, js_log: JetStreamLog) -> None:
    """agent/hardware.json (what the last heartbeat said of the machine, for `node status`) was
    written 0644 under a 022 umask. Written here by a real agent's heartbeat on a real log."""
    from grid.agent.sensors import FixedSensors
    from grid.agent.service import AgentOptions, HostAgent
    from tests.ports import engine_ports

    cfg = GridConfig(home=wide_home, nats_url=None)
    cfg.ensure_home()  # as `gridctl up` does before it starts the agent
    agent = HostAgent(js_log, cfg, AgentOptions(host_id=HOST, heartbeat_interval=0.2, sample_interval=0.1,
                                                port_range=engine_ports(4)), sensor_source=FixedSensors())
    await agent.start()
    try:
        hardware = AgentPaths.for_config(cfg).hardware
        deadline = time.monotonic() + 15
        while not hardware.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert hardware.exists(), "the agent's heartbeat wrote no hardware.json"
        assert hardware.read_bytes().startswith(b"{")
        assert mode(hardware) == 0o600
    finally:
        await agent.stop(drain=True)
    assert open_to_others(cfg.home) == []
