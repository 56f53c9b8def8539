"""A minimal HTTP/1.1 client for the private upstream hop (gateway -> engine), on asyncio streams.

Why not httpx here: measured on this fleet's 2-core machines, one pooled httpx round trip to a
trivial loopback server costs ~1.3 ms against ~0.2 ms for the same exchange on raw asyncio
streams (about 2,000 Python calls per request through the client, pool, anyio and h11 layers).
That alone would spend most of the gateway's 2 ms budget. The hop it serves is narrow — POST a
JSON body to a known engine, read a Content-Length or chunked (SSE) response — so a small,
strict client does the job; httpx remains the client everywhere else (CLI, tests) and can be
selected for this hop too (GRID_GATEWAY_UPSTREAM=httpx).

Behaviour:
* one `write` per request (head and body together: a single send on the wire);
* a keep-alive pool per (scheme, host, port); an idle connection is dropped when the server
  closed it, when it is older than the server's advertised Keep-Alive timeout minus a margin
  (default 4 s), or after the advertised max requests — so a reused connection is not one the
  server is about to close (a POST is never replayed, so that race must be avoided up front);
* a response is returned to the pool only when its body was read completely and both sides
  allow keep-alive; a partially read or `Connection: close` response closes its connection;
* every failure surfaces as an httpx exception subclass (ConnectError, ConnectTimeout,
  ReadTimeout, RemoteProtocolError), so callers handle both clients the same way.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
import time
from collections.abc import AsyncIterator

import httpx

MAX_HEAD_BYTES = 64 * 1024
READ_SIZE = 64 * 1024
DEFAULT_KEEPALIVE_SECONDS = 4.0
KEEPALIVE_MARGIN_SECONDS = 1.0
MAX_IDLE_PER_ORIGIN = 64


class UpstreamConnectError(httpx.ConnectError):
    pass


class UpstreamConnectTimeout(httpx.ConnectTimeout):
    pass


class UpstreamReadTimeout(httpx.ReadTimeout):
    pass


class UpstreamProtocolError(httpx.RemoteProtocolError):
    pass


class Target:
    """A pre-parsed upstream URL."""

    __slots__ = ("host", "host_header", "origin", "path", "port", "scheme")

    def __init__(self, url: str) -> None:
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise httpx.InvalidURL(f"not an http(s) engine endpoint: {url!r}")
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


class _Conn:
    __slots__ = ("idle_since", "keepalive", "max_requests", "origin", "reader", "requests", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, origin: tuple[str, str, int]):
        self.reader = reader
        self.writer = writer
        self.origin = origin
        self.requests = 0
        self.max_requests: int | None = None
        self.idle_since = 0.0
        self.keepalive = DEFAULT_KEEPALIVE_SECONDS

    def usable(self, now: float) -> bool:
        if self.writer.transport.is_closing() or self.reader.at_eof() or self.reader._buffer:  # type: ignore[attr-defined]
            return False  # closed by the server, or unsolicited bytes: never reuse
        if now - self.idle_since >= self.keepalive:
            return False
        return self.max_requests is None or self.requests < self.max_requests

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - already closed
            pass


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
    __slots__ = (
        "_closed",
        "_conn",
        "_done",
        "_mode",
        "_pool",
        "_read_timeout",
        "_remaining",
        "_reusable",
        "raw_headers",
        "status_code",
    )

    def __init__(self, pool: H1Pool, conn: _Conn, status: int, headers: list[tuple[bytes, bytes]],
                 mode: str, length: int, reusable: bool, read_timeout: float) -> None:
        self.status_code = status
        self.raw_headers = headers
        self._pool = pool
        self._conn = conn
        self._mode = mode  # "length" | "chunked" | "eof"
        self._remaining = length
        self._done = mode == "length" and length == 0
        self._reusable = reusable
        self._closed = False
        self._read_timeout = read_timeout

    async def _read_piece(self) -> bytes:
        reader = self._conn.reader
        try:
            async with asyncio.timeout(self._read_timeout):
                if self._mode == "length":
                    data = await reader.read(min(READ_SIZE, self._remaining))
                    if not data:
                        raise UpstreamProtocolError("the engine closed the connection mid-body")
                    self._remaining -= len(data)
                    if self._remaining <= 0:
                        self._done = True
                    return data
                if self._mode == "chunked":
                    line = await reader.readuntil(b"\r\n")
                    size = int(line.split(b";", 1)[0].strip(), 16)
                    if size < 0:
                        raise ValueError("negative chunk size")
                    if size == 0:
                        while (await reader.readuntil(b"\r\n")) != b"\r\n":
                            pass  # trailers
                        self._done = True
                        return b""
                    data = await reader.readexactly(size + 2)
                    if data[-2:] != b"\r\n":
                        raise ValueError("chunk without CRLF")
                    return data[:-2]
                data = await reader.read(READ_SIZE)
                if not data:
                    self._done = True
                return data
        except TimeoutError as exc:
            raise UpstreamReadTimeout("the engine stopped sending") from exc
        except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise UpstreamProtocolError(f"broken engine response: {type(exc).__name__}") from exc

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        try:
            while not self._done:
                piece = await self._read_piece()
                if piece:
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
        if self._done and self._reusable:
            self._pool._release(self._conn)
        else:
            self._conn.close()


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
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    target.host, target.port, ssl=ssl_ctx, limit=MAX_HEAD_BYTES
                )
        except TimeoutError as exc:
            raise UpstreamConnectTimeout(f"connecting to {target.host}:{target.port} timed out") from exc
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {target.host}:{target.port}: {exc.strerror or exc}") from exc
        self.opened += 1
        return _Conn(reader, writer, target.origin)

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
        conn.requests += 1
        try:
            conn.writer.write(payload)
            if conn.writer.transport.get_write_buffer_size() > 0:
                async with asyncio.timeout(self.write_timeout):
                    await conn.writer.drain()
            async with asyncio.timeout(self.read_timeout):
                while True:
                    raw = await conn.reader.readuntil(b"\r\n\r\n")
                    status, headers_out, version = _parse_head(raw)
                    if not (100 <= status < 200) or status == 101:
                        break
        except TimeoutError as exc:
            conn.close()
            raise UpstreamReadTimeout("the engine did not answer in time") from exc
        except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            conn.close()
            raise UpstreamProtocolError(f"the engine connection failed: {type(exc).__name__}") from exc
        except BaseException:
            conn.close()
            raise

        length = -1
        chunked = False
        reusable = version == b"HTTP/1.1" and not close
        for name, value in headers_out:
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    conn.close()
                    raise UpstreamProtocolError("invalid Content-Length from the engine") from None
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                if b"close" in value.lower():
                    reusable = False
            elif name == b"keep-alive":
                timeout, maximum = _parse_keepalive(value)
                if timeout is not None:
                    conn.keepalive = max(0.0, min(DEFAULT_KEEPALIVE_SECONDS, timeout - KEEPALIVE_MARGIN_SECONDS))
                if maximum is not None:
                    conn.max_requests = conn.requests + maximum - 1
        if status in (204, 304):
            mode, length = "length", 0
        elif chunked:
            mode = "chunked"
        elif length >= 0:
            mode = "length"
        else:
            mode, reusable = "eof", False
        return H1Response(self, conn, status, headers_out, mode, max(0, length), reusable, self.read_timeout)

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _parse_head(raw: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    lines = raw[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ValueError("not an HTTP/1.x status line")
    status = int(parts[1])
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ValueError("malformed header line")
        headers.append((name.strip().lower(), value.strip()))
    return status, headers, parts[0]
