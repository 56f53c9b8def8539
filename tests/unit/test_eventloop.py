"""Grid's long-running processes run on uvloop where it is installed, and the upstream HTTP
pool works on its transports (which are not asyncio.Transport subclasses)."""

from __future__ import annotations

import asyncio

import pytest

from grid import eventloop
from grid.gateway.h1 import H1Pool, Target

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
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                body = await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> list[bytes]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = H1Pool()
        answers = []
        try:
            for i in range(3):
                r = await pool.post(Target(f"http://127.0.0.1:{port}/v1/chat/completions"), b"echo %d" % i, [])
                answers.append(await r.aread())
                await r.aclose()
        finally:
            await pool.aclose()
            server.close()
        return answers

    assert eventloop.run(main()) == [b"echo 0", b"echo 1", b"echo 2"]
    assert connections == 1  # kept alive and reused
