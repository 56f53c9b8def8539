"""`gridctl up --nats URL`: an external server is not assumed durable (real processes).

Automatic mode needs a log that fsyncs every write. The embedded server is configured so; an
external one counts as durable only when it reports `sync_always` itself (its VARZ, which an
account sees when it imports the system service) or when the operator passes --assume-durable.
Otherwise up (or `gridctl serve controller`) says why and the controller only recommends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grid.events.base import new_event_id
from grid.events.control import ModeSet
from grid.transport.embedded import EmbeddedNats, find_nats_server, free_port
from grid.transport.jetstream import JetStreamLog
from tests.faults.test_up_nats_restart import GRIDCTL, start_up, stop_up

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# An account for the grid that imports the server's own VARZ report from the system account.
REPORTING_CONFIG = """\
listen: 127.0.0.1:{port}
jetstream {{
  store_dir: "{store}"
  sync_interval: always
}}
accounts {{
  SYS: {{ users: [{{user: sys, password: sys-secret}}], exports: [{{service: "$SYS.REQ.SERVER.PING.VARZ"}}] }}
  GRID: {{
    jetstream: enabled
    users: [{{user: grid, password: grid-secret}}]
    imports: [{{service: {{account: SYS, subject: "$SYS.REQ.SERVER.PING.VARZ"}}}}]
  }}
}}
system_account: SYS
"""


@pytest.fixture
def plain_server(tmp_path: Path) -> Iterator[str]:
    """sync_interval: always, but nothing this connection can ask says so."""
    server = EmbeddedNats(tmp_path / "external-nats")
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def reporting_server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    store = tmp_path / "reporting-nats"
    store.mkdir()
    config = store / "server.conf"
    config.write_text(REPORTING_CONFIG.format(port=port, store=store / "jetstream"))
    log = open(store / "server.log", "wb")
    proc = subprocess.Popen([str(find_nats_server()), "-c", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while "Server is ready" not in (store / "server.log").read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, (store / "server.log").read_text()
            time.sleep(0.05)
        yield f"nats://grid:grid-secret@127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def settled_mode(up_text: str, effective: str) -> dict[str, object]:
    """The status's mode block once the controller has ticked with the requested mode."""
    admin = re.search(r"admin API\s+(http://\S+)/allocator/status", up_text).group(1)  # type: ignore[union-attr]
    deadline = time.monotonic() + 15
    while True:
        mode = httpx.get(f"{admin}/allocator/status", timeout=10).json()["mode"]
        if (mode["requested"], mode["effective"]) == ("automatic", effective) or time.monotonic() > deadline:
            return mode  # type: ignore[no-any-return]
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("server", "flags", "durable"),
    [("plain_server", (), False), ("plain_server", ("--assume-durable",), True), ("reporting_server", (), True)],
    ids=["unreported-refused", "assume-durable", "reported-sync-always"],
)
def test_automatic_mode_needs_a_known_durable_external_server(
    request: pytest.FixtureRequest, tmp_path: Path, bundled_model_home: Path,
    server: str, flags: tuple[str, ...], durable: bool,
) -> None:
    url = request.getfixturevalue(server)
    up = start_up(tmp_path, bundled_model_home, "--nats", url, "--no-wait", *flags)
    try:
        text = up.wait_for("gridctl down` stops the grid", 120)
        mode = settled_mode(text, "automatic" if durable else "recommend")
        assert mode["requested"] == "automatic"
        assert mode["log_durable"] is durable
        assert mode["effective"] == ("automatic" if durable else "recommend")
        if not durable:
            assert "does not report its sync policy" in text and "--assume-durable" in text
    finally:
        stop_up(up)


@pytest.mark.parametrize(("flags", "durable"), [((), False), (("--assume-durable",), True)],
                         ids=["unreported-refused", "assume-durable"])
async def test_serve_controller_needs_a_known_durable_server(
    plain_server: str, tmp_path: Path, flags: tuple[str, ...], durable: bool
) -> None:
    home = tmp_path / "controller-home"
    home.mkdir()
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    port = free_port()
    log_path = tmp_path / "controller.log"
    with open(log_path, "w") as out:
        proc = subprocess.Popen([*GRIDCTL, "serve", "controller", "--nats", plain_server, "--port", str(port),
                                 *flags], env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log = await JetStreamLog.connect(plain_server, name="faults-test")
    try:
        await log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode="automatic"))
        deadline = time.monotonic() + 60
        mode: dict[str, object] = {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()
            try:
                mode = httpx.get(f"http://127.0.0.1:{port}/allocator/status", timeout=5).json()["mode"]
            except httpx.HTTPError:
                mode = {}
            if mode.get("requested") == "automatic" and mode.get("effective") == (
                    "automatic" if durable else "recommend"):
                break
            time.sleep(0.2)
        assert mode.get("log_durable") is durable, (mode, log_path.read_text())
        assert mode.get("effective") == ("automatic" if durable else "recommend")
        assert ("--assume-durable" in log_path.read_text()) is not durable
    finally:
        await log.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
