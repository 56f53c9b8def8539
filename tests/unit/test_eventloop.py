"""Grid's long-running processes run on uvloop where it is installed, and the upstream HTTP
pool works on its transports (which are not asyncio.Transport subclasses)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grid import eventloop
from grid.cli.main import app
from grid.transport.h1 import H1Pool
from tests.unit.transport.test_h1 import Server, fixed, start

uvloop = pytest.importorskip("uvloop")


def test_uvloop_is_the_default_and_the_environment_can_opt_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.ENV_VAR, raising=False)
    assert eventloop.loop_factory() is uvloop.new_event_loop
    monkeypatch.setenv(eventloop.ENV_VAR, "asyncio")
    assert eventloop.loop_factory() is None

    async def loop_type() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert eventloop.run(loop_type()).startswith("asyncio")
    monkeypatch.delenv(eventloop.ENV_VAR)
    assert eventloop.run(loop_type()).startswith("uvloop")


def test_a_loop_that_cannot_run_here_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV_VAR, "uvlop")
    with pytest.raises(eventloop.EventLoopChoiceError, match="use one of uvloop, asyncio"):
        eventloop.loop_factory()

    async def never() -> None:
        raise AssertionError("must not run")

    with pytest.raises(eventloop.EventLoopChoiceError):
        eventloop.run(never())
    monkeypatch.setenv(eventloop.ENV_VAR, "uvloop")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as on a machine without it
    with pytest.raises(eventloop.EventLoopChoiceError, match="not installed"):
        eventloop.loop_factory()
    monkeypatch.delenv(eventloop.ENV_VAR)
    assert eventloop.loop_factory() is None  # not asked for: the standard loop


def test_gridctl_says_which_loop_values_it_takes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(eventloop.ENV_VAR, "trio")
    monkeypatch.setenv("GRID_HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["serve", "gateway", "--nats", "nats://127.0.0.1:1"])
    assert result.exit_code == 1
    assert "GRID_EVENT_LOOP='trio': use one of uvloop, asyncio" in " ".join(result.output.split())


def test_the_upstream_pool_posts_and_reuses_connections_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.ENV_VAR, raising=False)
    server = Server(lambda request: fixed(request.split(b"\r\n\r\n", 1)[1]))

    async def main() -> list[bytes]:
        await start(server)
        pool = H1Pool()
        answers = []
        try:
            for i in range(3):
                r = await pool.post(server.target(), b"echo %d" % i, [])
                answers.append(await r.aread())
                await r.aclose()
        finally:
            await pool.aclose()
            assert server.server is not None
            server.server.close()
        return answers

    assert eventloop.run(main()) == [b"echo 0", b"echo 1", b"echo 2"]
    assert server.connections == 1  # kept alive and reused
