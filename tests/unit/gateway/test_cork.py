"""The head and body of a proxied answer leave in one transmission: behind Starlette's stack
(which wraps `send`), the response still finds the client socket and corks it."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.routing import Route

from grid.gateway.app import expose_client_socket
from grid.gateway.responses import RawResponse

TCP_CORK = getattr(socket, "TCP_CORK", None)
pytestmark = pytest.mark.skipif(TCP_CORK is None, reason="TCP_CORK is Linux-only")


async def test_raw_response_is_corked_behind_starlettes_wrapped_send() -> None:
    sockets: list[Any] = []
    corked_at_head: list[int] = []

    class RecordSocket:  # outermost: sees uvicorn's own send, passes it on unchanged
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                sockets.append(send.__self__.transport.get_extra_info("socket"))
            await self.app(scope, receive, send)

    class CheckCork:  # inside Starlette's stack: wraps send, as Starlette's own layers do
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            async def checked(message: Any) -> None:
                if message["type"] == "http.response.start":
                    corked_at_head.append(sockets[-1].getsockopt(socket.IPPROTO_TCP, TCP_CORK))
                await send(message)

            await self.app(scope, receive, checked if scope["type"] == "http" else send)

    async def answer(request: Request) -> RawResponse:
        return RawResponse(200, [(b"content-type", b"application/json")], b'{"ok":true}')

    app = Starlette(routes=[Route("/x", answer, methods=["POST"])], middleware=[Middleware(CheckCork)])
    server = uvicorn.Server(uvicorn.Config(RecordSocket(expose_client_socket(app)), host="127.0.0.1", port=0,
                                           log_level="warning", access_log=False, log_config=None, lifespan="off"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(trust_env=False) as client:
            r = await client.post(f"http://127.0.0.1:{port}/x", content=b"{}")
        assert r.status_code == 200 and r.content == b'{"ok":true}'
        assert corked_at_head == [1]  # the head waited in the kernel for the body
        assert sockets[-1].getsockopt(socket.IPPROTO_TCP, TCP_CORK) == 0 or sockets[-1].fileno() == -1
    finally:
        server.should_exit = True
        await task
