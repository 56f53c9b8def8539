"""A NATS server started from the config `gridctl nats init` wrote is trusted as durable.

Its JetStream fsyncs every write, but in operator mode the controller's credential may not ask
the server's VARZ (the system account's), so without a record `gridctl up --nats` would refuse
automatic mode. `nats init` records the server it configured (by server_name) under GRID_HOME;
a server run from the operator's own config, with only the snippet included, is not trusted.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
import structlog.testing

from grid.agent.options import AgentOptions
from grid.config import GridConfig
from grid.events.log import LogError
from grid.identity.connect import connect_log
from grid.identity.durability import external_log_durable, read_record
from grid.localgrid import LocalGrid, bundled_profile
from grid.transport.embedded import find_nats_server, free_port
from tests.ports import engine_ports

GRIDCTL = [sys.executable, "-m", "grid.cli.main"]


def nats_init(home: Path, *args: str) -> dict:  # type: ignore[type-arg]
    env = {k: v for k, v in os.environ.items() if k != "GRID_NATS_URL"} | {"GRID_HOME": str(home)}
    done = subprocess.run([*GRIDCTL, "nats", "init", "--tls-name", "127.0.0.1", *args, "--json"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture
def serve() -> Iterator:  # type: ignore[type-arg]
    procs: list[subprocess.Popen[bytes]] = []

    def start(config: Path) -> None:
        log = config.parent / "server.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(find_nats_server()), "-c", str(config)], stdout=out, stderr=subprocess.STDOUT)
        procs.append(proc)
        deadline = time.monotonic() + 20
        while "Server is ready" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(20)


async def test_the_server_nats_init_configured_counts_as_durable(tmp_path: Path, serve) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    port = free_port()
    out = nats_init(home, "--listen", f"127.0.0.1:{port}", "--monitor-port", "0",
                    "--server-dir", str(tmp_path / "etc-nats-grid"))
    config = Path(out["nats_server_config"][-1])
    assert config.parent == tmp_path / "etc-nats-grid" and (config.stat().st_mode & 0o777) == 0o600
    text = config.read_text()
    assert "sync_interval: always" in text and f"server_name: {out['server_name']}" in text
    assert read_record(home).servers[out["server_name"]].sync_always
    serve(config)

    grid = LocalGrid(GridConfig(home=home, nats_url=None), nats_url=f"tls://127.0.0.1:{port}", mode="automatic",
                     profile=bundled_profile(min_replicas=0, max_replicas=1),
                     agent_options=AgentOptions(failure_domain="local", port_range=engine_ports()))
    await grid.start()
    try:
        # No --assume-durable, and the server does not report its sync policy to this credential.
        assert await grid.log.server_syncs_always() is None  # type: ignore[union-attr]
        assert grid.log.durable is True  # type: ignore[union-attr]
        assert grid.durability_note == ""
    finally:
        await grid.stop()

    # Re-running init keeps the server's name (the running server stays recognised).
    assert nats_init(home, "--listen", f"127.0.0.1:{port}", "--monitor-port", "0")["server_name"] == out["server_name"]


async def test_a_server_from_the_operators_own_config_is_not_trusted(tmp_path: Path, serve) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    out = nats_init(home)
    snippet = Path(out["server_config"])
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    shutil.copy(snippet, server_dir / snippet.name)
    port = free_port()
    (server_dir / "nats.conf").write_text(
        f"listen: 127.0.0.1:{port}\njetstream {{ store_dir: \"{server_dir / 'js'}\" }}\ninclude {snippet.name}\n")
    serve(server_dir / "nats.conf")
    log = None
    for _ in range(100):
        try:
            log = await connect_log(f"tls://127.0.0.1:{port}", credentials=Path(out["credentials"]["controller"]),
                                    tls_ca=home / "identity" / "tls" / "ca.pem")
            break
        except LogError:
            time.sleep(0.1)
    assert log is not None
    try:
        with structlog.testing.capture_logs() as logs:
            assert await external_log_durable(log, home) == (False, None, None)
            await log.client.flush()
            await asyncio.sleep(0.3)  # a permissions violation arrives asynchronously
        # Its credential may not ask the server's VARZ: it does not, so nothing is refused.
        assert [e for e in logs if e.get("event") == "nats connection error"] == []
    finally:
        await log.close()
