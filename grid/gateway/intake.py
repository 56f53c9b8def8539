"""Reading a request body off the wire: bounded in size, in time, and in how many may be pending.

A body that arrived with its headers (the common case: a small JSON request) is taken at once
and never counted. A body still on its way holds a connection and memory, so those requests
are counted: beyond `max_incomplete` a new one is refused at once (503, Retry-After), and each
must finish within `timeout_seconds` (else 408). Both refusals close the connection, since the
rest of an unread body would otherwise be parsed as the next request. Without these bounds,
clients that send half a body and stop held hundreds of requests open indefinitely.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Message, Receive

from grid.gateway import errors

_CLOSE = {"Connection": "close"}


async def _poll(receive: Receive) -> Message | None:
    """The next ASGI message if the server already has it, else None (nothing is consumed).

    The same technique as Starlette's `Request.is_disconnected`: a receive inside an already
    cancelled scope returns only when it completes without waiting.
    """
    message: Message | None = None
    with anyio.CancelScope() as scope:
        scope.cancel()
        message = await receive()
    return message


class BodyReader:
    def __init__(self, *, max_bytes: int, timeout_seconds: float, max_incomplete: int) -> None:
        self.max_bytes = max_bytes
        self.timeout_seconds = timeout_seconds
        self.max_incomplete = max_incomplete
        self.incomplete = 0  # requests whose bodies are arriving right now
        self.refused = 0
        self.timed_out = 0

    def stats(self) -> dict[str, Any]:
        return {"incomplete": self.incomplete, "refused": self.refused, "timed_out": self.timed_out,
                "max_incomplete": self.max_incomplete, "timeout_seconds": self.timeout_seconds}

    async def read(self, receive: Receive, declared: bytes | None) -> bytes | Response:
        """The whole body, or the error response to send instead."""
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                return errors.bad_request("Invalid Content-Length header.")
            if size > self.max_bytes:
                return self._too_large()
        message = await _poll(receive)
        if message is not None and message["type"] == "http.request" and not message.get("more_body", False):
            body: bytes = message.get("body", b"")
            return self._too_large() if len(body) > self.max_bytes else body
        if self.incomplete >= self.max_incomplete:
            self.refused += 1
            return errors.error_response(
                503, "Too many requests are still sending their bodies; retry shortly.", errors.UNAVAILABLE,
                errors.CODE_TOO_MANY_INCOMPLETE, retry_after=1.0, headers=_CLOSE,
            )
        self.incomplete += 1
        try:
            async with asyncio.timeout(self.timeout_seconds):
                return await self._rest(receive, message)
        except TimeoutError:
            self.timed_out += 1
            return errors.error_response(
                408, f"The request body did not arrive within {self.timeout_seconds:g} seconds.",
                errors.INVALID_REQUEST, errors.CODE_BODY_TIMEOUT, headers=_CLOSE,
            )
        finally:
            self.incomplete -= 1

    async def _rest(self, receive: Receive, message: Message | None) -> bytes | Response:
        chunks: list[bytes] = []
        total = 0
        while True:
            if message is None:
                message = await receive()
            if message["type"] == "http.disconnect":
                return errors.bad_request("The client disconnected while sending the body.")
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                return self._too_large()
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            message = None

    def _too_large(self) -> Response:
        return errors.error_response(
            413, f"Request body exceeds the {self.max_bytes} byte limit.", errors.INVALID_REQUEST,
            errors.CODE_BODY_TOO_LARGE, headers=_CLOSE,
        )
