"""The head and body of a proxied answer leave in one transmission: behind Starlette's stack
(which wraps `send`), the response still finds the client socket and corks it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.routing import Route

from grid.gateway.app import expose_client_socket
from grid.gateway.responses import ProxyStream, RawResponse

TCP_CORK = getattr(socket, "TCP_CORK", None)
pytestmark = pytest.mark.skipif(TCP_CORK is None, reason="TCP_CORK is Linux-only")


class _Served:
    """Where the served route listens, the client sockets it answered on, and whether each
    response's head found its socket corked (1) or not (0)."""

    def __init__(self) -> None:
        self.url = ""
        self.sockets: list[Any] = []
        self.corked_at_head: list[int] = []


@contextlib.asynccontextmanager
async def _serving(answer: Callable[[Request], Awaitable[Any]]) -> AsyncIterator[_Served]:
    """`answer` as POST /x behind Starlette's stack, on a loopback port."""
    served = _Served()

    class RecordSocket:  # outermost: sees uvicorn's own send, passes it on unchanged
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                served.sockets.append(send.__self__.transport.get_extra_info("socket"))
            await self.app(scope, receive, send)

    class CheckCork:  # inside Starlette's stack: wraps send, as Starlette's own layers do
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            async def checked(message: Any) -> None:
                if message["type"] == "http.response.start":
                    served.corked_at_head.append(served.sockets[-1].getsockopt(socket.IPPROTO_TCP, TCP_CORK))
                await send(message)

            await self.app(scope, receive, checked if scope["type"] == "http" else send)

    app = Starlette(routes=[Route("/x", answer, methods=["POST"])], middleware=[Middleware(CheckCork)])
    server = uvicorn.Server(uvicorn.Config(RecordSocket(expose_client_socket(app)), host="127.0.0.1", port=0,
                                           log_level="warning", access_log=False, log_config=None, lifespan="off"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        served.url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/x"
        yield served
    finally:
        server.should_exit = True
        await task


async def test_raw_response_is_corked_behind_starlettes_wrapped_send() -> None:
    async def answer(request: Request) -> RawResponse:
        return RawResponse(200, [(b"content-type", b"application/json")], b'{"ok":true}')

    async with _serving(answer) as served:
        async with httpx.AsyncClient(trust_env=False) as client:
            r = await client.post(served.url, content=b"{}")
        assert r.status_code == 200 and r.content == b'{"ok":true}'
        assert served.corked_at_head == [1]  # the head waited in the kernel for the body
        last = served.sockets[-1]
        assert last.getsockopt(socket.IPPROTO_TCP, TCP_CORK) == 0 or last.fileno() == -1


class _Upstream:
    """An upstream answer (grid.gateway.upstream.UpstreamResponse) whose first chunk comes only
    once `release` is set; `head_only` as grid.infer.client.NatsResponse sets it."""

    status_code = 200
    raw_headers = [(b"content-type", b"text/event-stream")]

    def __init__(self, head_only: bool) -> None:
        self.head_only = head_only
        self.release = asyncio.Event()

    async def aiter_raw(self) -> Any:
        await self.release.wait()
        yield b'data: {"choices":[]}\n\n'
        yield b"data: [DONE]\n\n"

    async def aread(self) -> bytes:
        return b"".join([c async for c in self.aiter_raw()])

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("head_only", [True, False])
async def test_a_streams_head_leaves_at_once_when_it_came_before_any_token(head_only: bool) -> None:
    """A stream's head that came alone (the engine has no token yet) goes to the client at once,
    uncorked: the client reads it while the engine works, not on the first token's path. A head
    that came with the first bytes is corked with them (one transmission)."""
    upstream = _Upstream(head_only)

    async def answer(request: Request) -> ProxyStream:
        return ProxyStream(200, list(upstream.raw_headers), upstream, lambda _c: None, lambda _o: None)

    try:
        async with _serving(answer) as served:
            async with httpx.AsyncClient(trust_env=False) as client:
                async with client.stream("POST", served.url, content=b"{}") as r:
                    if head_only:
                        # The client has the head while the upstream has not sent a byte.
                        assert r.status_code == 200 and not upstream.release.is_set()
                    upstream.release.set()
                    body = await r.aread()
            assert body.endswith(b"data: [DONE]\n\n")
            assert served.corked_at_head == [0 if head_only else 1]
    finally:
        upstream.release.set()
