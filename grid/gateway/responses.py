"""Minimal ASGI responses for the proxy hot path.

`RawResponse` sends a complete body with pre-built raw headers (corked into one transmission).
`ProxyStream` relays an upstream stream chunk by chunk without buffering (the head is corked
together with the first chunk only, unless it came before any: then it leaves at once); it
watches the client connection and, when the client goes away, stops reading upstream at once
(closing that connection), instead of silently draining a generation nobody will read.
`on_done(outcome)` runs exactly once.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from typing import Any

import httpx

from grid.gateway.upstream import UpstreamResponse

_TCP_CORK = getattr(socket, "TCP_CORK", None)


# Where the gateway's server entry (grid.gateway.app) puts the client connection's socket in an
# HTTP scope. Starlette hands a response a wrapped `send` (its exception handling and error
# middleware), so the server's transport cannot be found from `send` itself: looking there
# alone, the cork below never engaged behind Starlette's stack.
SOCKET_SCOPE_KEY = "grid.client_socket"


def _cork(scope: Any, send: Any) -> Any:
    """Hold the status line and body in the kernel until both are written (Linux TCP_CORK).

    uvicorn writes the head and the body of a response separately; on loopback each write
    is a packet and a wake-up of the client, which measurably adds to every proxied request
    (the client, woken by the head, can take the CPU before the body is written: packet
    captures under bench.remote_overhead showed 0.05-0.85 ms between the two). Corking makes
    them one transmission. Best effort: anything unexpected means no cork.
    """
    if _TCP_CORK is None:
        return None
    try:
        sock = scope.get(SOCKET_SCOPE_KEY)
        if sock is None:  # called with the server's own send (no Starlette in between)
            sock = send.__self__.transport.get_extra_info("socket")
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, 1)
        return sock
    except Exception:  # noqa: BLE001 - another server, a closed socket: just send normally
        return None


def _uncork(sock: Any) -> None:
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, 0)
        except OSError:
            pass


STREAM_OK = "ok"
STREAM_CLIENT_GONE = "cancelled"
STREAM_UPSTREAM_BROKEN = "upstream_error"
STREAM_UPSTREAM_TIMEOUT = "upstream_timeout"
# The transport to the upstream was lost (the gateway's NATS connection): not the engine's fault.
STREAM_CONNECTION_LOST = "connection_lost"
# The serving host's agent stopped answering within the bound its progress markers set
# (grid.infer.client.SilentHost): the host is taken out of routing until it heartbeats again.
STREAM_UPSTREAM_SILENT = "upstream_silent"
# The serving host's engine stalled (grid.infer.client.EngineStalled): a failure of that route.
STREAM_ENGINE_STALLED = "engine_stalled"

# Outcomes of upstream errors that name themselves (their `code`, see grid.infer.client).
_NAMED_OUTCOMES = {"upstream_connection_lost": STREAM_CONNECTION_LOST, "upstream_silent": STREAM_UPSTREAM_SILENT,
                   "engine_stalled": STREAM_ENGINE_STALLED}
# The last event of an OpenAI event stream: a client that leaves after it has the whole answer.
_DONE_EVENT = b"data: [DONE]"


def upstream_outcome(exc: httpx.HTTPError) -> str:
    """The stream outcome of an upstream failure mid-stream."""
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code in _NAMED_OUTCOMES:
        return _NAMED_OUTCOMES[code]
    return STREAM_UPSTREAM_TIMEOUT if isinstance(exc, httpx.TimeoutException) else STREAM_UPSTREAM_BROKEN


def completes_event_stream(chunk: bytes) -> bool:
    """Whether `chunk` ends with the event stream's final `data: [DONE]` event."""
    return chunk.rstrip().endswith(_DONE_EVENT)


class RawResponse:
    __slots__ = ("after", "body", "headers", "status_code")

    def __init__(self, status_code: int, headers: list[tuple[bytes, bytes]], body: bytes,
                 after: Callable[[], None] | None = None) -> None:
        self.status_code = status_code
        self.headers = headers
        self.body = body
        self.after = after  # runs once the response was handed to the server (or failed to be)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = self.headers + [(b"content-length", str(len(self.body)).encode())]
        sock = _cork(scope, send)
        try:
            try:
                await send({"type": "http.response.start", "status": self.status_code, "headers": headers})
                await send({"type": "http.response.body", "body": self.body, "more_body": False})
            finally:
                _uncork(sock)
        finally:
            if self.after is not None:
                after, self.after = self.after, None
                after()


class ProxyStream:
    __slots__ = ("headers", "on_chunk", "on_done", "status_code", "upstream")

    def __init__(
        self,
        status_code: int,
        headers: list[tuple[bytes, bytes]],
        upstream: UpstreamResponse,
        on_chunk: Callable[[bytes], None],
        on_done: Callable[[str], None],
    ) -> None:
        self.status_code = status_code
        self.headers = headers
        self.upstream = upstream
        self.on_chunk = on_chunk
        self.on_done = on_done

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = False
        pumping = True

        async def watch() -> None:
            nonlocal gone
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    break
            if pumping:
                gone = True
                task.cancel()

        watcher = asyncio.create_task(watch())
        outcome = STREAM_OK
        # The head alone (upstream.head_only: the engine has no token yet) goes to the client at
        # once, uncorked: the client reads it while the engine works, not on the first token's
        # path. Otherwise it is corked with the first chunk.
        sock = None if getattr(self.upstream, "head_only", False) else _cork(scope, send)
        last = b""
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.headers})
            on_chunk = self.on_chunk
            async for chunk in self.upstream.aiter_raw():
                on_chunk(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                last = chunk
                if sock is not None:
                    _uncork(sock)
                    sock = None
            pumping = False
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            pumping = False
            # A client that leaves once it has the final event (before the agent's end-of-answer
            # message arrived) got the whole answer: not a cancelled request.
            outcome = STREAM_OK if completes_event_stream(last) else STREAM_CLIENT_GONE
            if not gone:
                raise  # a real shutdown: let it propagate
            task.uncancel()
        except httpx.HTTPError as exc:
            pumping = False
            outcome = upstream_outcome(exc)
            await self._end(send, self._error_event(exc))
        except OSError:
            pumping = False
            outcome = STREAM_CLIENT_GONE
        finally:
            _uncork(sock)
            pumping = False
            watcher.cancel()
            try:
                await self.upstream.aclose()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail; nothing to do
                pass
            self.on_done(outcome)

    def _error_event(self, exc: httpx.HTTPError) -> bytes:
        """An error that names itself for the client (grid.infer.client's UpstreamConnectionLost,
        SilentHost and EngineStalled) ends an event stream with an OpenAI-shaped error event, so
        the client knows why and that it may retry."""
        code = getattr(exc, "code", None)
        message = getattr(exc, "client_message", None)
        if not (isinstance(code, str) and isinstance(message, str) and self._event_stream()):
            return b""
        return b"data: " + json.dumps({"error": {"message": message, "type": "server_error",
                                                  "param": None, "code": code}}).encode() + b"\n\n"

    def _event_stream(self) -> bool:
        return any(k.lower() == b"content-type" and v.lower().startswith(b"text/event-stream") for k, v in self.headers)

    @staticmethod
    async def _end(send: Any, last: bytes = b"") -> None:
        try:
            await send({"type": "http.response.body", "body": last, "more_body": False})
        except Exception:  # noqa: BLE001 - the client may be gone too
            pass
