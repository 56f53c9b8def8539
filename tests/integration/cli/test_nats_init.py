"""`gridctl nats init` prepares an existing nats-server: with the snippet included it runs in
operator mode with TLS, the grid's own credentials work, and an anonymous client is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest

from grid.events.log import LogError
from grid.events.subjects import CONTROL_STREAM
from grid.identity.connect import connect_log
from grid.transport.embedded import find_nats_server, free_port
from tests.security.conftest import event

GRIDCTL = [sys.executable, "-m", "grid.cli.main"]


async def test_an_existing_server_with_the_snippet_runs_the_grid_secured(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "GRID_HOME": str(home)}
    init = subprocess.run([*GRIDCTL, "nats", "init", "--tls-name", "127.0.0.1", "--json"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    out = json.loads(init.stdout)
    assert out["tls_fingerprint"].startswith("sha256:")
    snippet = Path(out["server_config"])
    assert (snippet.stat().st_mode & 0o777) == 0o600

    # The operator's own server: its config, plus the include line the command asked for.
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    shutil.copy(snippet, server_dir / snippet.name)
    port = free_port()
    (server_dir / "nats.conf").write_text(
        f"listen: 127.0.0.1:{port}\njetstream {{ store_dir: \"{server_dir / 'js'}\" }}\ninclude {snippet.name}\n")
    proc = subprocess.Popen([str(find_nats_server()), "-c", str(server_dir / "nats.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"tls://127.0.0.1:{port}"
    ca = home / "identity" / "tls" / "ca.pem"
    try:
        controller = None
        for _ in range(100):
            try:
                controller = await connect_log(url, credentials=Path(out["credentials"]["controller"]), tls_ca=ca)
                break
            except LogError:
                time.sleep(0.1)
        assert controller is not None, "the controller could not connect with its credential"
        try:
            await controller.append(event("control.mode_set.v1"))
            assert await controller.last_sequence(CONTROL_STREAM) == 1
        finally:
            await controller.close()
        operator = await connect_log(url, credentials=Path(out["credentials"]["operator"]), tls_ca=ca,
                                     ensure_streams=False)
        try:
            assert [m.seq async for m in operator.replay(CONTROL_STREAM)] == [1]
        finally:
            await operator.close()
        with pytest.raises(Exception):
            nc = await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False, max_reconnect_attempts=0,
                                    connect_timeout=3)
            await nc.close()
    finally:
        proc.terminate()
        proc.wait(10)
