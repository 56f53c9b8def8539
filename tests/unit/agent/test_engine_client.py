"""The agent's engine client against a real loopback HTTP server: after a request that ends
its connection ("Connection: close", as every stream does), the next request finds a
connection already open."""

from __future__ import annotations

import asyncio

from grid.agent.engine_client import H1EngineClient

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n%s\r\n{}"


async def test_a_closing_request_leaves_a_warm_connection_for_the_next() -> None:
    connections = 0
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))
                requests.append(head)
                close = b"connection: close" in head.lower()
                writer.write(ANSWER % (b"connection: close\r\n" if close else b""))
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
    client = H1EngineClient()
    try:
        r = await client.post(url, b"{}", [(b"connection", b"close")])
        assert r.status_code == 200 and b"".join([p async for p in r.aiter_raw()]) == b"{}"
        await r.aclose()
        for _ in range(100):  # the warm-up runs in the background
            if connections == 2:
                break
            await asyncio.sleep(0.01)
        assert connections == 2 and len(requests) == 1  # opened, nothing sent on it
        r = await client.post(url, b"{}", [])
        assert b"".join([p async for p in r.aiter_raw()]) == b"{}"
        await r.aclose()
        assert connections == 2 and len(requests) == 2  # the warm connection carried it
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
