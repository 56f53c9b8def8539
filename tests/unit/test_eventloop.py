"""Grid's long-running processes run on uvloop where it is installed, and the upstream HTTP
pool works on its transports (which are not asyncio.Transport subclasses)."""

from __future__ import annotations

import asyncio

import pytest

from grid import eventloop
from grid.gateway.h1 import H1Pool
from tests.unit.gateway.test_h1 import Server, fixed, start

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
