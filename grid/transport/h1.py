"""A minimal HTTP/1.1 client for the host agent's hop to its own loopback engine
(grid.agent.engine_client; also the gateway's "h1" upstream backend, which only benches use):
an asyncio Protocol per connection, responses parsed by `httptools` (llhttp, the parser uvicorn
uses).

Why not httpx (or aiohttp) here: `python -m bench.engine_hop` (its defaults: 100 interleaved
rounds against one real llama-server, SmolLM2-135M Q4_1, 1 thread, 1 slot, then 1,500 rounds
against a tiny server answering at once with llama-server's own response heads; every client in
one process on the agent's event loop (uvloop), with the agent's headers, key, limits and
timeouts; a 2-core machine shared with other work, load average 2 to 7) measured, two runs
(first/second), "diff" being the median per-round difference to h1 in ms:

    real llama-server            h1           httpx.AsyncClient  httpx transport    aiohttp
    plain, pooled  p50 ms        15.99/17.00  16.74/17.02        16.89/18.00        15.65/16.02
                   diff          -            +1.30/+1.22        +1.16/+0.57        +0.43/-0.29
                   CPU us/req    389/380      1858/1823          1404/1332          735/698
    plain after a stream  diff   -            +2.14/+2.43        +1.49/+2.03        +0.63/+1.40
    stream first chunk    diff   -            +1.38/+2.96        +0.82/+0.77        +0.45/+0.71
    stream full answer    diff   -            +1.65/+2.12        +1.79/+1.30        +1.22/-0.09
                   CPU us/req    1375/1432    3034/3182          2651/2811          1428/1468

    fixed server (no engine)     h1           httpx.AsyncClient  httpx transport    aiohttp
    plain, pooled  p50 ms        0.161/0.153  1.084/0.996        0.755/0.662        0.420/0.407
                   CPU us/req    143/136      1052/952           741/692            384/355
    plain after a stream p50 ms  0.174/0.159  1.692/1.619        1.422/1.331        0.905/0.910
    stream first chunk p50 ms    0.284/0.259  1.145/1.109        0.880/0.786        0.559/0.534
    stream full answer p50 ms    0.305/0.281  1.363/1.311        1.077/0.968        0.637/0.614

(max_tokens=1 non-streamed, "plain after a stream" being the first one after a stream ended its
connection; the stream is max_tokens=4 with "Connection: close", as the agent sends it; "httpx
transport" is grid.infer.responder.HttpxEngineClient, the responder's default.) The engine's own
p50 moves by a millisecond between runs, so one p50 ratio on the real hop says little (h1/httpx
0.955 and 0.998, plain, pooled); the paired difference does: httpx adds 1.2-1.3 ms to a pooled
max_tokens=1 request (7-8% of the whole hop), 2.1-2.4 ms to the first request after a stream (it
connects on the critical path, where h1 finds the spare grid.agent.engine_client opened) and
1.4-3.0 ms to the first streamed chunk, and it costs the agent 4.8x h1's CPU per request (1.4-1.5
ms more, on a host whose engine wants the same cores). Without the engine, h1 answers 4-10x
sooner at p50 and costs about a seventh of httpx's CPU per request, and 2.6x less than aiohttp's.

The hop is narrow — POST a JSON body to a known engine, read a Content-Length or chunked
(SSE) response — so a small, strict client does the job; httpx remains the client everywhere
else (CLI, tests, the responder's engine health checks).

Behaviour:
* one `write` per request (head and body together: a single send on the wire);
* a keep-alive pool per (scheme, host, port); an idle connection is dropped when the server
  closed it or sent anything unsolicited, when it is older than the server's advertised
  Keep-Alive timeout minus a margin (default 4 s), or after the advertised max requests — so
  a reused connection is not one the server is about to close;
* a POST is sent exactly once: a connection that breaks after the request was written is an
  error for the caller, never a silent retry (the engine may already be generating);
* a response is returned to the pool only when its body was read completely and both sides
  allow keep-alive; a partially read or `Connection: close` response closes its connection;
* body chunks are buffered up to a high-water mark, then the socket stops being read until
  the caller catches up (a slow requester never makes the agent buffer a whole generation);
* every failure surfaces as an httpx exception subclass (ConnectError, ConnectTimeout,
  ReadTimeout, RemoteProtocolError), mapped in one place (`_transport_error`), so callers
  handle both clients the same way.
"""

from __future__ import annotations

import asyncio
import collections
import ssl as ssl_module
import time
import typing
from collections.abc import AsyncIterator

import httptools
import httpx

DEFAULT_KEEPALIVE_SECONDS = 4.0
KEEPALIVE_MARGIN_SECONDS = 1.0
MAX_IDLE_PER_ORIGIN = 64
MAX_HEAD_BYTES = 64 * 1024
# Body bytes held per connection before reading from the socket pauses (and resumes below LOW).
HIGH_WATER_BYTES = 256 * 1024
LOW_WATER_BYTES = 64 * 1024


class UpstreamConnectError(httpx.ConnectError):
    pass


class UpstreamConnectTimeout(httpx.ConnectTimeout):
    pass


class UpstreamReadTimeout(httpx.ReadTimeout):
    pass


class UpstreamProtocolError(httpx.RemoteProtocolError):
    pass


# The phases a failure can happen in; `_transport_error` maps (phase, cause) to one exception.
CONNECT = "connect"
ANSWER = "answer"  # request written, waiting for the response head
BODY = "body"  # reading the response body

# Causes that mean "this connection is broken" rather than a bug in the caller.
_TRANSPORT_CAUSES = (OSError, EOFError, TimeoutError, httptools.HttpParserError, ValueError)


def _transport_error(exc: BaseException, phase: str, where: str) -> httpx.TransportError:
    """The single mapping from asyncio, socket and parser failures to httpx exceptions."""
    if isinstance(exc, TimeoutError):
        if phase == CONNECT:
            return UpstreamConnectTimeout(f"connecting to {where} timed out")
        if phase == ANSWER:
            return UpstreamReadTimeout("the engine did not answer in time")
        return UpstreamReadTimeout("the engine stopped sending")
    if phase == CONNECT:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return UpstreamConnectError(f"cannot connect to {where}: {detail}")
    if phase == ANSWER:
        return UpstreamProtocolError(f"the engine connection failed: {type(exc).__name__}")
    return UpstreamProtocolError(f"broken engine response: {type(exc).__name__}")


class Target:
    """A pre-parsed upstream URL."""

    __slots__ = ("host", "host_header", "origin", "path", "port", "scheme", "url")

    def __init__(self, url: str) -> None:
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise httpx.InvalidURL(f"not an http(s) engine endpoint: {url!r}")
        self.url = url
        self.scheme = parsed.scheme
        self.host = parsed.host
        self.port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self.path = parsed.raw_path.decode("ascii") or "/"
        self.origin = (self.scheme, self.host, self.port)
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        self.host_header = (host if self.port == default else f"{host}:{self.port}").encode("ascii")

    def __repr__(self) -> str:
        return f"Target({self.scheme}://{self.host_header.decode()}{self.path})"


class _Conn(asyncio.Protocol):
    """One upstream connection: the transport, its parser, and the response being read."""

    def __init__(self, origin: tuple[str, str, int]) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.requests = 0
        self.max_requests: int | None = None
        self.idle_since = 0.0
        self.keepalive = DEFAULT_KEEPALIVE_SECONDS
        self.lost = False
        self.broken = False  # unsolicited bytes or a parse failure: never reuse
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._write_paused = False
        self._read_paused = False
        self._reset()

    def _reset(self) -> None:
        self.expecting = False
        self.informational = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.error: BaseException | None = None

    # --- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: uvloop's TCP transport is not an asyncio.Transport subclass.
        self.transport = typing.cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self.expecting:
            self.broken = True  # bytes nobody asked for: this connection is out of step
            return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, ValueError) as exc:
            self.broken = True
            if not self.complete:
                self.error = exc
        self._wake()

    def eof_received(self) -> bool | None:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.expecting and not self.complete and self.error is None:
            if self.head_done and self._until_eof():
                self.complete = True  # an EOF-delimited body ends with the connection
            else:
                self.error = exc or ConnectionResetError("the engine closed the connection")
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # --- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            self.broken = True  # a second response to one request

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value)
        if self.head_bytes > MAX_HEAD_BYTES:
            raise ValueError("response head too large")
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self.informational = True  # 100 Continue and friends: the real head follows
            self.headers = []
            return
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(bytes(body))
        self.buffered += len(body)
        if self.buffered > HIGH_WATER_BYTES and not self._read_paused and self.transport is not None:
            self._read_paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        self.complete = True

    # --- used by the pool and the response -----------------------------------------------------------

    def _until_eof(self) -> bool:
        return not any(n in (b"content-length", b"transfer-encoding") for n, _ in self.headers)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error
        if self.lost and not self.complete:
            raise ConnectionResetError("the engine closed the connection")

    async def send(self, payload: bytes, write_timeout: float) -> None:
        assert self.transport is not None
        self._reset()
        self.expecting = True
        self.requests += 1
        self.transport.write(payload)
        if self._write_paused and not self.lost:
            self._drain = asyncio.get_running_loop().create_future()
            async with asyncio.timeout(write_timeout):
                await self._drain

    async def read_head(self) -> None:
        while not self.head_done:
            self._raise_if_failed()
            await self._wait()

    async def read_piece(self) -> bytes:
        """Every body byte received so far (at least one piece); b"" once the body is complete.

        Pieces that arrived together leave together: llama-server often writes two SSE events
        (the role delta and the first token) in one packet, and handing them out one by one
        cost the agent a second NATS message on the time-to-first-token path (a remote-host
        bench measured the first token 0.3 ms later)."""
        chunks = self.chunks
        while not chunks:
            if self.complete:
                return b""
            self._raise_if_failed()
            await self._wait()
        piece = chunks.popleft() if len(chunks) == 1 else b"".join([chunks.popleft() for _ in range(len(chunks))])
        self.buffered -= len(piece)
        if self._read_paused and self.buffered <= LOW_WATER_BYTES and self.transport is not None:
            self._read_paused = False
            self.transport.resume_reading()
        return piece

    def usable(self, now: float) -> bool:
        if self.transport is None or self.transport.is_closing() or self.lost or self.broken:
            return False  # closed by the server, or unsolicited bytes: never reuse
        if now - self.idle_since >= self.keepalive:
            return False
        return self.max_requests is None or self.requests < self.max_requests

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _parse_keepalive(value: bytes) -> tuple[float | None, int | None]:
    timeout = maximum = None
    for part in value.split(b","):
        k, _, v = part.strip().partition(b"=")
        try:
            if k.lower() == b"timeout":
                timeout = float(v)
            elif k.lower() == b"max":
                maximum = int(v)
        except ValueError:
            continue
    return timeout, maximum


class H1Response:
    __slots__ = ("_closed", "_conn", "_pool", "_read_timeout", "_reusable", "raw_headers", "status_code")

    def __init__(self, pool: H1Pool, conn: _Conn, reusable: bool, read_timeout: float) -> None:
        self.status_code = conn.status
        self.raw_headers = conn.headers
        self._pool = pool
        self._conn = conn
        self._reusable = reusable
        self._closed = False
        self._read_timeout = read_timeout

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        conn = self._conn
        try:
            while True:
                try:
                    async with asyncio.timeout(self._read_timeout):
                        piece = await conn.read_piece()
                except _TRANSPORT_CAUSES as exc:
                    raise _transport_error(exc, BODY, conn.origin[1]) from exc
                if not piece:
                    return
                yield piece
        except BaseException:
            self._reusable = False
            raise

    async def aread(self) -> bytes:
        parts = [p async for p in self.aiter_raw()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn = self._conn
        if conn.complete and not conn.chunks and self._reusable and not conn.broken:
            conn.expecting = False
            self._pool._release(conn)
        else:
            conn.close()


class H1Pool:
    def __init__(self, *, connect_timeout: float = 5.0, read_timeout: float = 600.0,
                 write_timeout: float = 30.0, max_idle_per_origin: int = MAX_IDLE_PER_ORIGIN) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.max_idle = max_idle_per_origin
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._ssl: ssl_module.SSLContext | None = None
        self.opened = 0
        self.reused = 0

    async def _connect(self, target: Target) -> _Conn:
        ssl_ctx = None
        if target.scheme == "https":
            if self._ssl is None:
                self._ssl = ssl_module.create_default_context()
            ssl_ctx = self._ssl
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Conn(target.origin), target.host, target.port, ssl=ssl_ctx
                )
        except _TRANSPORT_CAUSES as exc:
            raise _transport_error(exc, CONNECT, f"{target.host}:{target.port}") from exc
        self.opened += 1
        return conn

    def _acquire_idle(self, origin: tuple[str, str, int]) -> _Conn | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.usable(now):
                self.reused += 1
                return conn
            conn.close()
        return None

    def _release(self, conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        idle = self._idle.setdefault(conn.origin, [])
        if len(idle) >= self.max_idle or not conn.usable(conn.idle_since):
            conn.close()
            return
        idle.append(conn)

    async def post(self, target: Target, body: bytes, headers: list[tuple[bytes, bytes]]) -> H1Response:
        close = False
        head = [b"POST ", target.path.encode("ascii"), b" HTTP/1.1\r\nhost: ", target.host_header,
                b"\r\ncontent-length: ", str(len(body)).encode("ascii"), b"\r\n"]
        for name, value in headers:
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name:
                raise httpx.LocalProtocolError("header with a line break")
            if name == b"connection" and value.lower() == b"close":
                close = True
            head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        payload = b"".join(head) + body

        conn = self._acquire_idle(target.origin)
        if conn is None:
            conn = await self._connect(target)
        try:
            await conn.send(payload, self.write_timeout)
            async with asyncio.timeout(self.read_timeout):
                await conn.read_head()
        except _TRANSPORT_CAUSES as exc:
            conn.close()
            raise _transport_error(exc, ANSWER, target.host) from exc
        except BaseException:
            conn.close()
            raise

        reusable = conn.keep_alive and not close
        for name, value in conn.headers:
            if name == b"keep-alive":
                timeout, maximum = _parse_keepalive(value)
                if timeout is not None:
                    conn.keepalive = max(0.0, min(DEFAULT_KEEPALIVE_SECONDS, timeout - KEEPALIVE_MARGIN_SECONDS))
                if maximum is not None:
                    conn.max_requests = conn.requests + maximum - 1
        return H1Response(self, conn, reusable, self.read_timeout)

    async def warm(self, target: Target) -> bool:
        """Open one idle connection to `target` ahead of need, unless one is idle already.

        Nothing is sent on it, so nothing can be replayed; a failure is ignored (the next
        request connects itself and reports it). True when a connection was added.
        """
        if self._idle.get(target.origin):
            return False
        try:
            conn = await self._connect(target)
        except httpx.HTTPError:
            return False
        if self._idle.get(target.origin):  # a request released one meanwhile
            conn.close()
            return False
        self._release(conn)
        return True

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
