"""`gridctl up` listens where the user said or refuses to start: a port left in TIME_WAIT by a
stopped grid is free (the real listener binds it), a port a live process listens on is refused
with the port, the option and its holder named, before anything starts."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from grid.cli.up_ports import DEFAULT_GATEWAY_PORT, NamedPort, first_taken, gateway_port
from grid.config import GridConfig
from grid.serving import serve
from grid.transport.embedded import port_in_use
from tests.integration.agent.agentkit import seed_cache

GRIDCTL = [sys.executable, "-m", "grid.cli.main"]


def _port_left_in_time_wait() -> int:
    """A loopback port whose listener is gone and whose last connection sits in TIME_WAIT on the
    listener's side, as `gridctl down` leaves the gateway's port after serving clients."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = int(listener.getsockname()[1])
        with socket.create_connection(("127.0.0.1", port)) as client:
            conn, _ = listener.accept()
            conn.close()  # the server closes first: the TIME_WAIT is on its side, on `port`
            assert client.recv(1) == b""
    return port


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    env.pop("GRID_NATS_URL", None)
    return env


def _in_time_wait(port: int) -> bool:
    return any(c.status == psutil.CONN_TIME_WAIT and c.laddr and c.laddr.port == port
               for c in psutil.net_connections(kind="tcp"))


def _plain_bind_refused(port: int) -> bool:
    """What the probe said before it set SO_REUSEADDR."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


async def test_a_port_in_time_wait_is_free_and_the_real_listener_binds_it() -> None:
    port = _port_left_in_time_wait()
    assert _in_time_wait(port) and _plain_bind_refused(port), "the test must really leave TIME_WAIT behind"

    assert not port_in_use(port)
    assert first_taken([NamedPort("--port", "127.0.0.1", port)]) is None

    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("here"))])
    server = await serve(app, "127.0.0.1", port)
    try:
        assert server.port == port
        async with httpx.AsyncClient(trust_env=False) as client:
            assert (await client.get(f"http://127.0.0.1:{port}/")).text == "here"
    finally:
        await server.stop()


def test_a_named_port_a_live_listener_holds_is_refused_with_its_holder(taken_port: int) -> None:
    named = [NamedPort("--admin-port", "127.0.0.1", 0), NamedPort("--dashboard-port", "127.0.0.1", taken_port)]
    refusal = first_taken(named)
    assert refusal is not None
    assert (refusal.option, refusal.port) == ("--dashboard-port", taken_port)
    assert refusal.holder is not None and refusal.holder.startswith(f"pid {os.getpid()} (")
    assert f"port {taken_port} on 127.0.0.1 (--dashboard-port) is in use by pid {os.getpid()}" in refusal.message


def test_only_the_unnamed_gateway_port_is_chosen_anew() -> None:
    notes: list[str] = []
    assert gateway_port("127.0.0.1", 18080, notes.append, in_use=lambda port, host: True) == 18080
    assert gateway_port("127.0.0.1", None, notes.append, in_use=lambda port, host: False) == DEFAULT_GATEWAY_PORT
    assert notes == []
    assert gateway_port("127.0.0.1", None, notes.append, in_use=lambda port, host: True) == 0
    assert len(notes) == 1 and f"port {DEFAULT_GATEWAY_PORT} is taken" in notes[0]


@pytest.mark.parametrize("option", ["--port", "--admin-port", "--dashboard-port"])
def test_up_refuses_a_taken_named_port_before_starting_anything(tmp_path: Path, taken_port: int, option: str) -> None:
    home = tmp_path / "home"
    done = subprocess.run([*GRIDCTL, "up", "--no-wait", option, str(taken_port)], env=_env(home),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    said = " ".join(done.stderr.split())
    assert f"port {taken_port} on 127.0.0.1 ({option}) is in use by pid {os.getpid()}" in said, done.stderr
    assert not (home / "up.pid").exists() and not (home / "nats").exists()


def test_up_right_after_down_serves_on_the_port_it_was_given(tmp_path: Path, bundled_gguf: Path) -> None:
    """The issue's case end to end: the gateway's port still holds a closed connection in
    TIME_WAIT, and `gridctl up --port` serves there (observe mode: no engine is started)."""
    home = tmp_path / "home"
    seed_cache(GridConfig(home=home, nats_url=None), bundled_gguf)
    port = _port_left_in_time_wait()
    assert _in_time_wait(port)
    out = tmp_path / "up.out"
    with open(out, "wb") as sink:
        up = subprocess.Popen([*GRIDCTL, "up", "--mode", "observe", "--no-wait", "--no-dashboard", "--port", str(port)],
                              env=_env(home), stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while "Ctrl-C" not in out.read_text() and up.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        printed = " ".join(out.read_text().split())
        assert f"gateway http://127.0.0.1:{port}/v1" in printed, printed
        assert "taken" not in printed
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10, trust_env=False).status_code == 200
    finally:
        down = subprocess.run([*GRIDCTL, "down"], env=_env(home), capture_output=True, text=True, timeout=120)
        if up.poll() is None:
            up.kill()
        up.wait(timeout=30)
    assert down.returncode == 0, down.stderr
