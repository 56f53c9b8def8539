"""The upstream HTTP/1.1 client against real loopback servers with scripted answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from grid.transport.embedded import free_port
from grid.transport.h1 import H1Pool, Target

Answer = Callable[[bytes], bytes | None]  # request head+body -> raw response (None: close)


class Server:
    def __init__(self, answer: Answer, *, delay: float = 0.0, close_after_each: bool = False) -> None:
        self.answer = answer
        self.delay = delay
        self.close_after_each = close_after_each
        self.port = 0
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.AbstractServer | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                if self.delay:
                    await asyncio.sleep(self.delay)
                out = self.answer(head + body)
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
                if self.close_after_each or b"connection: close" in out.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def target(self, path: str = "/v1/chat/completions") -> Target:
        return Target(f"http://127.0.0.1:{self.port}{path}")


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Server]]:
    servers: list[Server] = []

    def make(answer: Answer, **kw: float | bool) -> Server:
        s = Server(answer, **kw)  # type: ignore[arg-type]
        servers.append(s)
        return s

    yield make
    for s in servers:
        if s.server is not None:
            s.server.close()


async def start(s: Server) -> Server:
    s.server = await asyncio.start_server(s._handle, "127.0.0.1", 0)
    s.port = s.server.sockets[0].getsockname()[1]
    return s


def fixed(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body), extra, body)


async def test_content_length_response_and_keep_alive_reuse(serve: Callable[..., Server]) -> None:
    s = await start(serve(lambda req: fixed(b'{"ok":true}')))
    pool = H1Pool()
    for _ in range(3):
        r = await pool.post(s.target(), b'{"a":1}', [(b"content-type", b"application/json")])
        assert r.status_code == 200 and await r.aread() == b'{"ok":true}'
        await r.aclose()
    assert s.connections == 1 and pool.reused == 2
    head = s.requests[0]
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and head.endswith(b'{"a":1}')
    assert b"content-length: 7\r\n" in head and b"host: 127.0.0.1:" in head
    await pool.aclose()


async def test_chunked_stream_with_extensions_and_trailers(serve: Callable[..., Server]) -> None:
    events = [b"data: {\"x\":1}\n\n", b"data: [DONE]\n\n"]
    body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\nx-trailer: y\r\n\r\n"
    raw = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + body
    s = await start(serve(lambda req: raw))
    pool = H1Pool()
    r = await pool.post(s.target(), b"{}", [])
    # Events that arrived together come out as one piece (one NATS message, one write downstream).
    assert [p async for p in r.aiter_raw()] == [b"".join(events)]
    await r.aclose()
    r2 = await pool.post(s.target(), b"{}", [])  # fully read: the connection was reused
    assert await r2.aread() == b"".join(events)
    await r2.aclose()
    assert s.connections == 1
    await pool.aclose()


async def test_connection_close_and_partial_reads_are_not_reused(serve: Callable[..., Server]) -> None:
    s = await start(serve(lambda req: fixed(b"x" * 10, b"connection: close\r\n")))
    pool = H1Pool()
    for _ in range(2):
        r = await pool.post(s.target(), b"{}", [])
        await r.aread()
        await r.aclose()
    assert s.connections == 2
    big = await start(serve(lambda req: fixed(b"y" * 200_000)))
    r = await pool.post(big.target(), b"{}", [])
    async for _ in r.aiter_raw():
        break  # abandon mid-body
    await r.aclose()
    r = await pool.post(big.target(), b"{}", [])
    assert len(await r.aread()) == 200_000
    await r.aclose()
    assert big.connections == 2
    # a request that says Connection: close is not returned to the pool either
    r = await pool.post(big.target(), b"{}", [(b"connection", b"close")])
    await r.aread()
    await r.aclose()
    r = await pool.post(big.target(), b"{}", [])
    await r.aread()
    await r.aclose()
    assert big.connections == 3
    await pool.aclose()


async def test_keep_alive_timeout_is_respected(serve: Callable[..., Server]) -> None:
    s = await start(serve(lambda req: fixed(b"ok", b"keep-alive: timeout=1, max=100\r\n")))
    pool = H1Pool()
    r = await pool.post(s.target(), b"{}", [])
    await r.aread()
    await r.aclose()
    await asyncio.sleep(0.05)  # timeout=1 minus the 1 s margin: never reused
    r = await pool.post(s.target(), b"{}", [])
    await r.aread()
    await r.aclose()
    assert s.connections == 2
    await pool.aclose()


async def test_a_server_closed_idle_connection_is_not_reused(serve: Callable[..., Server]) -> None:
    # like llama-server after a stream: it answers, then closes without announcing it
    s = await start(serve(lambda req: fixed(b"ok"), close_after_each=True))
    pool = H1Pool()
    for _ in range(3):
        r = await pool.post(s.target(), b"{}", [])
        assert await r.aread() == b"ok"
        await r.aclose()
        await asyncio.sleep(0.02)  # the FIN arrives while the connection idles in the pool
    assert s.connections == 3 and pool.reused == 0
    await pool.aclose()


async def test_failures_are_httpx_exceptions(serve: Callable[..., Server]) -> None:
    pool = H1Pool(read_timeout=0.3, connect_timeout=1.0)
    with pytest.raises(httpx.ConnectError):
        await pool.post(Target(f"http://127.0.0.1:{free_port()}/v1/x"), b"{}", [])
    garbage = await start(serve(lambda req: b"NOT HTTP AT ALL\r\n\r\n"))
    with pytest.raises(httpx.RemoteProtocolError):
        await pool.post(garbage.target(), b"{}", [])
    hangup = await start(serve(lambda req: None))
    with pytest.raises(httpx.RemoteProtocolError):
        await pool.post(hangup.target(), b"{}", [])
    assert len(hangup.requests) == 1 and hangup.connections == 1  # never replayed
    slow = await start(serve(lambda req: fixed(b"late"), delay=1.0))
    with pytest.raises(httpx.ReadTimeout):
        await pool.post(slow.target(), b"{}", [])
    short = await start(serve(lambda req: b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"))
    r = await pool.post(short.target(), b"{}", [])
    with pytest.raises(httpx.TimeoutException):  # the rest never comes
        await r.aread()
    await r.aclose()
    with pytest.raises(httpx.LocalProtocolError):
        await pool.post(garbage.target(), b"{}", [(b"x-evil", b"a\r\nb")])
    with pytest.raises(httpx.InvalidURL):
        Target("ftp://example/x")
    await pool.aclose()


async def test_a_post_on_a_pooled_connection_that_breaks_is_sent_once(serve: Callable[..., Server]) -> None:
    # The engine answers the first request with keep-alive, then reads the second and hangs up.
    s = await start(serve(lambda req: fixed(b"ok") if b'"n":1' in req else None))
    pool = H1Pool()
    r = await pool.post(s.target(), b'{"n":1}', [])
    assert await r.aread() == b"ok"
    await r.aclose()
    with pytest.raises(httpx.RemoteProtocolError):
        await pool.post(s.target(), b'{"n":2}', [])
    assert [req.endswith(b'{"n":2}') for req in s.requests] == [False, True]
    assert s.connections == 1 and pool.opened == 1
    await pool.aclose()


async def test_unsolicited_bytes_make_an_idle_connection_unusable(serve: Callable[..., Server]) -> None:
    # An answer followed by bytes nobody asked for: the connection is out of step, never reused.
    s = await start(serve(lambda req: fixed(b"ok") + b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"))
    pool = H1Pool()
    for _ in range(2):
        r = await pool.post(s.target(), b"{}", [])
        assert await r.aread() == b"ok"
        await r.aclose()
        await asyncio.sleep(0.02)
    assert s.connections == 2 and pool.reused == 0
    await pool.aclose()


async def test_a_slow_reader_pauses_the_socket_and_gets_every_byte(serve: Callable[..., Server]) -> None:
    body = bytes(range(256)) * 8192  # 2 MiB, far above the high-water mark
    s = await start(serve(lambda req: fixed(body)))
    pool = H1Pool()
    r = await pool.post(s.target(), b"{}", [])
    got = []
    async for piece in r.aiter_raw():
        got.append(piece)
        await asyncio.sleep(0)  # let the socket fill the buffer while we lag
    await r.aclose()
    assert b"".join(got) == body
    await pool.aclose()


async def test_warm_opens_one_idle_connection_that_the_next_post_reuses(serve: Callable[..., Server]) -> None:
    s = await start(serve(lambda req: fixed(b"{}")))
    pool = H1Pool()
    assert await pool.warm(s.target()) is True
    assert await pool.warm(s.target()) is False  # one is idle already
    r = await pool.post(s.target(), b"{}", [])
    assert await r.aread() == b"{}"
    await r.aclose()
    assert s.connections == 1 and pool.reused == 1 and len(s.requests) == 1  # nothing sent by warm
    closed = Target(f"http://127.0.0.1:{free_port()}/v1/chat/completions")
    assert await pool.warm(closed) is False  # a refused connect is ignored
    await pool.aclose()
