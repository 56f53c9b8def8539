"""Connection limits for every HTTP listener Grid runs (gateway, admin API, dashboard, agent metrics).

One place defines them; each listener builds its uvicorn server with `uvicorn_options(limits)`.

GRID_HTTP_HEADER_SECONDS    how long a request head (request line and headers) may take to arrive,
                            from the connection opening or from its first byte after a keep-alive
                            pause; then 408 and close (default 10)
GRID_HTTP_KEEPALIVE_SECONDS how long an idle keep-alive connection stays open between requests
                            (default 15: longer than common clients' own idle expiry, httpx's 5 s
                            for one, so a client rarely reuses a connection the server is closing)
GRID_HTTP_MAX_CONNECTIONS   open connections per listener; a new one beyond it first closes an idle
                            keep-alive connection, else its request is answered 503 and the
                            connection closed (default 1024)
GRID_HTTP_MAX_HEAD_BYTES    size of a request head (request line and headers); beyond it 431 and
                            close (default 64 KiB)

Incident (issue 25): a request line followed by one byte every 5 s stayed open over 180 s, and
200 connections that never sent a byte were never closed. uvicorn arms its keep-alive timer only
after a response, and has no timer for a request head at all: `LimitedHttpToolsProtocol` adds one.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_SECONDS_ENV = "GRID_HTTP_HEADER_SECONDS"
KEEPALIVE_SECONDS_ENV = "GRID_HTTP_KEEPALIVE_SECONDS"
MAX_CONNECTIONS_ENV = "GRID_HTTP_MAX_CONNECTIONS"
MAX_HEAD_BYTES_ENV = "GRID_HTTP_MAX_HEAD_BYTES"


@dataclass(frozen=True)
class ListenerLimits:
    header_seconds: float = 10.0
    keep_alive_seconds: float = 15.0
    max_connections: int = 1024
    max_head_bytes: int = 64 * 1024

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ListenerLimits:
        env = os.environ if environ is None else environ
        kwargs: dict[str, Any] = {}
        if env.get(HEADER_SECONDS_ENV):
            kwargs["header_seconds"] = max(0.1, float(env[HEADER_SECONDS_ENV]))
        if env.get(KEEPALIVE_SECONDS_ENV):
            kwargs["keep_alive_seconds"] = max(0.1, float(env[KEEPALIVE_SECONDS_ENV]))
        if env.get(MAX_CONNECTIONS_ENV):
            kwargs["max_connections"] = max(1, int(env[MAX_CONNECTIONS_ENV]))
        if env.get(MAX_HEAD_BYTES_ENV):
            kwargs["max_head_bytes"] = max(1024, int(env[MAX_HEAD_BYTES_ENV]))
        return cls(**kwargs)


def _answer(status_line: bytes) -> bytes:
    return status_line + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request-head deadline, a head size bound and
    eviction of idle connections at the connection limit. `limits` is set on a subclass made
    per listener by `uvicorn_options`."""

    limits: ListenerLimits = ListenerLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._idle_since = time.monotonic()

    # --- states -------------------------------------------------------------------------------

    def _idle(self) -> bool:
        """Between requests with nothing of the next one received (a keep-alive pause, or a
        connection that has not sent a byte yet)."""
        return (self._head_bytes == 0 and not self.pipeline
                and (self.cycle is None or self.cycle.response_complete)
                and not self.transport.is_closing())

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_seconds, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_bytes:
            self.transport.write(_answer(b"HTTP/1.1 408 Request Timeout"))
        self.transport.close()

    # --- protocol -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()
        if len(self.connections) > self.limits.max_connections:
            self._evict_an_idle_connection()

    def _evict_an_idle_connection(self) -> None:
        idle = [c for c in self.connections
                if c is not self and isinstance(c, LimitedHttpToolsProtocol) and c._idle()]
        if not idle:
            return  # this connection's request is answered 503 (uvicorn's limit_concurrency)
        victim = min(idle, key=lambda c: c._idle_since)
        victim.connections.discard(victim)
        victim.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 1
        self._arm_head_timer()  # keeps the deadline armed at connection_made, if any

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.limits.max_head_bytes and not self.transport.is_closing():
            self._disarm_head_timer()
            self.transport.write(_answer(b"HTTP/1.1 431 Request Header Fields Too Large"))
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm_head_timer()
        self._head_bytes = 0
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        self._idle_since = time.monotonic()
        super().on_response_complete()


def uvicorn_options(limits: ListenerLimits | None = None) -> dict[str, Any]:
    """The uvicorn.Config keyword arguments that apply `limits` (default: from the environment)."""
    limits = ListenerLimits.from_environ() if limits is None else limits
    protocol = type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})
    return {
        "http": protocol,
        "timeout_keep_alive": limits.keep_alive_seconds,
        # uvicorn answers 503 when its connections reach this (the new one included).
        "limit_concurrency": limits.max_connections + 1,
        "h11_max_incomplete_event_size": limits.max_head_bytes,
    }
