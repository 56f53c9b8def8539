"""The agent's hop to its own engine: grid.transport.h1 against httpx (and aiohttp) in one run.

The host agent forwards every inference request it takes from NATS to its loopback llama-server
(grid.infer.responder): one POST of a JSON body with the host's engine key, a Content-Length
answer, or an SSE stream sent with "Connection: close" (llama-server drops the connection after
a stream without saying so). This bench times that hop with each HTTP client the agent could
use, on the agent's own event loop (grid.eventloop: uvloop where installed;
GRID_EVENT_LOOP=asyncio for the standard loop), all clients in one process:

  * h1: `grid.agent.engine_client.H1EngineClient`, as the agent builds it (grid.transport.h1's
    pool; after a stream, a spare connection opened in the background);
  * httpx: an `httpx.AsyncClient` (keep-alive; 256 connections, as many idle, idle expiry 4 s:
    the agent's limits; connect 5 s, read 600 s, write 30 s);
  * httpx-transport: `grid.infer.responder.HttpxEngineClient`, the responder's default (an
    httpx transport used without the AsyncClient's layers);
  * aiohttp: an `aiohttp.ClientSession` with the same limits, when aiohttp is installed (it is
    not a Grid dependency: `pip install aiohttp`, or the `bench` extra).

Two parts, each in interleaved rounds (every client once per round, the order turning each
round, so drift of a shared machine hits every client alike), each round three requests per
client:

  * "plain after a stream": a non-streamed chat, max_tokens=1, the first request after that
    client's stream ended its connection (h1 finds the spare it opened; the others connect);
  * "plain, pooled": the same again, on the connection the previous one left;
  * "stream": a streamed chat (max_tokens=4, "Connection: close"): the time to the first SSE
    data chunk and to the end of the answer.

1. engine: one real llama-server (SmolLM2-135M Q4_1, the bundled model, the runtime an agent
   would use: xllamacpp's prebuilt server by default) with a random bearer key. The hop as it is,
   engine time included.
2. fixed: a tiny asyncio server in a process of its own that answers at once with llama-server's
   own response heads (captured from it: Keep-Alive timeout=5, max=100 on a Content-Length
   answer, a chunked SSE stream ending with "Connection: close"), a fixed 585-byte JSON and a
   fixed six-event stream, so that engine time does not drown the clients' difference.

For each part, measure and client it prints p50 and p99 in ms, each against h1's (ratio), the
median of the per-round difference to h1 (paired: one round's requests run back to back), and
the client process's CPU per request (mean, us; CLOCK_PROCESS_CPUTIME_ID around the request, and
for h1's streams also the spare connection it opens after them), then h1/httpx for every measure.

    python -m bench.engine_hop [--rounds 100] [--fixed-rounds 1500] [--threads 1]
    python -m bench.engine_hop --clients h1,httpx --no-engine   # the fixed server only

A default run takes about a minute and a half on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import typing
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from bench._common import MESSAGES, REPO, pct, stop_process, wait_http
from grid.infer import wire
from grid.infer.responder import EngineRoute, HttpxEngineClient, HttpxEngineResponse, engine_request_headers

CHAT_PATH = "/v1/chat/completions"
CLIENTS = ("h1", "httpx", "httpx-transport", "aiohttp")
AIOHTTP_MISSING = "aiohttp not installed (pip install aiohttp)"
# The agent's limits: the responder's 256 requests in flight, h1's 4 s idle expiry.
MAX_CONNECTIONS = 256
KEEPALIVE_SECONDS = 4.0
CONNECT_TIMEOUT, READ_TIMEOUT, WRITE_TIMEOUT = 5.0, 600.0, 30.0

KINDS = ("after_stream", "pooled", "stream")
MEASURES = (  # (label, kind, which time)
    ("plain after a stream", "after_stream", "full"),
    ("plain, pooled", "pooled", "full"),
    ("stream first chunk", "stream", "first"),
    ("stream full answer", "stream", "full"),
)


# --- the clients ----------------------------------------------------------------------------------

class Response(Protocol):
    @property
    def status_code(self) -> int: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Client(Protocol):
    """grid.infer.responder.EngineClient, plus `settle` (background work a request left)."""

    async def post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Response: ...

    async def settle(self) -> None: ...

    async def aclose(self) -> None: ...


class H1Client:
    """The agent's engine client, as grid.agent.service builds it."""

    def __init__(self) -> None:
        from grid.agent.engine_client import H1EngineClient

        self._client = H1EngineClient(connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT)

    async def post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Response:
        return await self._client.post(url, body, headers)

    async def settle(self) -> None:
        # The spare connection a closing response opens in the background: its CPU is charged
        # to the stream that made it, not to whichever request runs next.
        warming = list(getattr(self._client, "_warming", {}).values())
        if warming:
            await asyncio.gather(*warming, return_exceptions=True)

    async def aclose(self) -> None:
        await self._client.aclose()


class HttpxAsyncClient:
    """httpx.AsyncClient, keep-alive, with the agent's limits and timeouts."""

    def __init__(self) -> None:
        self._client = httpx.AsyncClient(
            trust_env=False,
            limits=httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS,
                                keepalive_expiry=KEEPALIVE_SECONDS),
            timeout=httpx.Timeout(connect=CONNECT_TIMEOUT, read=READ_TIMEOUT, write=WRITE_TIMEOUT, pool=30.0),
        )

    async def post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Response:
        request = self._client.build_request("POST", url, content=body, headers=headers)
        return HttpxEngineResponse(await self._client.send(request, stream=True))

    async def settle(self) -> None:
        pass

    async def aclose(self) -> None:
        await self._client.aclose()


class HttpxTransportClient:
    """The responder's default engine client (an httpx transport used directly)."""

    def __init__(self) -> None:
        self._client = HttpxEngineClient(connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT,
                                         max_connections=MAX_CONNECTIONS)

    async def post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Response:
        return await self._client.post(url, body, headers)

    async def settle(self) -> None:
        pass

    async def aclose(self) -> None:
        await self._client.aclose()


class _AiohttpResponse:
    __slots__ = ("_response",)

    def __init__(self, response: Any) -> None:
        self._response = response

    @property
    def status_code(self) -> int:
        return int(self._response.status)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        async for piece in self._response.content.iter_any():
            yield piece

    async def aclose(self) -> None:
        # Back to the pool when read to the end and both sides keep it alive, else closed.
        released = self._response.release()
        if inspect.isawaitable(released):
            await released


class AiohttpClient:
    """aiohttp.ClientSession with the agent's limits (made on the running loop)."""

    def __init__(self) -> None:
        import aiohttp

        self._aiohttp = aiohttp
        self._session: Any = None

    async def post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Response:
        if self._session is None:
            aiohttp = self._aiohttp
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_SECONDS),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT),
                auto_decompress=False, trust_env=False)
        response = await self._session.post(url, data=body, allow_redirects=False,
                                            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers])
        return _AiohttpResponse(response)

    async def settle(self) -> None:
        pass

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


FACTORIES: dict[str, Callable[[], Client]] = {
    "h1": H1Client, "httpx": HttpxAsyncClient, "httpx-transport": HttpxTransportClient, "aiohttp": AiohttpClient,
}


def aiohttp_installed() -> bool:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return False
    return True


# --- one request, rounds ----------------------------------------------------------------------------

@dataclass
class Sample:
    full: float  # seconds to the end of the answer (and the response closed)
    first: float  # seconds to the first body piece (for a stream: the first SSE data chunk)
    cpu: float  # this process's CPU seconds for the request (and what it left in the background)


@dataclass
class Results:
    clients: list[str]
    samples: dict[str, dict[str, list[Sample]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.samples = {kind: {c: [] for c in self.clients} for kind in KINDS}

    def values(self, kind: str, client: str, which: str) -> list[float]:
        return [getattr(s, which) for s in self.samples[kind][client]]


async def one(client: Client, url: str, body: bytes, headers: list[tuple[bytes, bytes]], stream: bool) -> Sample:
    """One request as the responder makes it: POST, read the body piece by piece, close."""
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    response = await client.post(url, body, headers)
    first = 0.0
    pieces = []
    try:
        async for piece in response.aiter_raw():
            if not first and (not stream or b"data:" in piece):
                first = time.perf_counter() - t0
            pieces.append(piece)
    finally:
        await response.aclose()
    full = time.perf_counter() - t0
    await client.settle()
    cpu = time.process_time() - cpu0
    answer = b"".join(pieces)
    if response.status_code != 200 or not answer:
        raise RuntimeError(f"{url}: HTTP {response.status_code} {answer[:200]!r}")
    if stream and b"[DONE]" not in answer:
        raise RuntimeError(f"{url}: the stream ended without [DONE]: {answer[-200:]!r}")
    return Sample(full, first or full, cpu)


def bodies(model: str) -> tuple[bytes, bytes]:
    plain = json.dumps({"model": model, "messages": MESSAGES, "max_tokens": 1, "temperature": 0}).encode()
    stream = json.dumps({"model": model, "messages": MESSAGES, "max_tokens": 4, "temperature": 0,
                         "stream": True}).encode()
    return plain, stream


async def rounds(names: list[str], url: str, key: str | None, *, count: int, warmup: int,
                 model: str = "smollm2") -> Results:
    """`count` interleaved rounds (after `warmup` unmeasured ones) of the three requests of each
    client, with the headers the agent sends (grid.infer.responder.engine_request_headers)."""
    route = EngineRoute(url, key)
    plain_headers = engine_request_headers(route, {wire.H_CONTENT_TYPE: "application/json"})
    stream_headers = engine_request_headers(route, {wire.H_CONTENT_TYPE: "application/json",
                                                    wire.H_CONNECTION: "close"})
    plain_body, stream_body = bodies(model)
    target = url.rstrip("/") + CHAT_PATH
    results = Results(names)
    clients = {n: FACTORIES[n]() for n in names}
    try:
        for i in range(warmup + count):
            order = names[i % len(names):] + names[:i % len(names)]
            for kind in KINDS:
                stream = kind == "stream"
                for name in order:
                    sample = await one(clients[name], target, stream_body if stream else plain_body,
                                       stream_headers if stream else plain_headers, stream)
                    if i >= warmup:
                        results.samples[kind][name].append(sample)
    finally:
        for c in clients.values():
            with contextlib.suppress(Exception):
                await c.aclose()
    return results


# --- the fixed server ---------------------------------------------------------------------------------

# llama-server's own answers (the heads captured from it; bodies of the same sizes).
_PLAIN_BODY = json.dumps({
    "choices": [{"finish_reason": "length", "index": 0, "message": {"role": "assistant", "content": "Hello"}}],
    "created": 1796680466, "model": "smollm2", "system_fingerprint": "b0-unknown", "object": "chat.completion",
    "usage": {"completion_tokens": 1, "prompt_tokens": 33, "total_tokens": 34,
              "prompt_tokens_details": {"cached_tokens": 32}},
    "id": "chatcmpl-" + "x" * 32,
    "timings": {"cache_n": 32, "prompt_n": 1, "prompt_ms": 16.5, "prompt_per_token_ms": 16.5,
                "prompt_per_second": 60.3, "predicted_n": 1, "predicted_ms": 0.001,
                "predicted_per_token_ms": 0.0, "predicted_per_second": 0.0}}, separators=(",", ":")).encode()
_HEAD = b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\n"
MAX_REQUESTS_PER_CONNECTION = 100  # llama-server's Keep-Alive max


def _plain_answer(last: bool) -> bytes:
    tail = b"Connection: close\r\n" if last else b"Keep-Alive: timeout=5, max=100\r\n"
    return (_HEAD + b"Content-Type: application/json; charset=utf-8\r\nContent-Length: %d\r\n%s\r\n%s"
            % (len(_PLAIN_BODY), tail, _PLAIN_BODY))


def _event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return b"data: " + json.dumps({
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta}], "created": 1796680466,
        "id": "chatcmpl-" + "x" * 32, "model": "smollm2", "system_fingerprint": "b0-unknown",
        "object": "chat.completion.chunk"}, separators=(",", ":")).encode() + b"\n\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# The writes of one stream, in the packets llama-server sends them: the head; the role delta and
# the first token together; one token each; the last delta, [DONE] and the end of the body.
STREAM_WRITES = (
    _HEAD + b"X-Accel-Buffering: no\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n",
    _chunk(_event({"role": "assistant", "content": None}) + _event({"content": "Hello"})),
    _chunk(_event({"content": "!"})),
    _chunk(_event({"content": " I"})),
    _chunk(_event({"content": "'m"})),
    _chunk(_event({}, "length")) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n",
)


class _FixedProtocol(asyncio.Protocol):
    """HTTP/1.1 enough for this bench: a head, a Content-Length body; a streamed request (its body
    says "stream":true) gets the SSE answer and the connection closed, like llama-server."""

    def __init__(self) -> None:
        self.buffer = b""
        self.served = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            length = 0
            for line in head.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4:end + 4 + length]
            self.buffer = self.buffer[end + 4 + length:]
            self._answer(b'"stream": true' in body or b'"stream":true' in body)

    def _answer(self, stream: bool) -> None:
        assert self.transport is not None
        self.served += 1
        if stream:
            asyncio.get_running_loop().create_task(self._stream(self.transport))
            return
        last = self.served >= MAX_REQUESTS_PER_CONNECTION
        self.transport.write(_plain_answer(last))
        if last:
            self.transport.close()

    async def _stream(self, transport: asyncio.Transport) -> None:
        for data in STREAM_WRITES:  # one write each, a loop turn apart (separate packets)
            transport.write(data)
            await asyncio.sleep(0)
        transport.close()


async def serve_fixed() -> None:
    """The fixed server's process: print its port, serve until SIGTERM."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_FixedProtocol, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()


@contextlib.contextmanager
def fixed_server() -> Iterator[str]:
    """The fixed server in a process of its own (its CPU is not this process's); yields its URL."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-m", "bench.engine_hop", "serve-fixed"], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


# --- the engine ---------------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def engine(threads: int) -> AsyncIterator[tuple[str, str]]:
    """One llama-server on the bundled model with a random key, as bench._common.one_host_grid
    starts it; yields its endpoint and key."""
    from grid.agent.artifacts import ensure_bundled_model
    from grid.agent.engines.llama_cpp import EngineSpec, spawn
    from grid.agent.engines.runtime import find_runtime
    from grid.config import GridConfig
    from grid.secrets import write_owner_only
    from grid.transport.embedded import free_port

    cache = Path(os.environ.get("GRID_BENCH_CACHE", Path.home() / ".cache" / "grid-bench"))
    model_path = ensure_bundled_model(GridConfig(home=cache, nats_url=None))
    runtime = find_runtime()  # the runtime an agent would use (xllamacpp's prebuilt server by default)
    if runtime is None:
        sys.exit("no llama.cpp runtime: pip install xllamacpp")
    with tempfile.TemporaryDirectory(prefix="grid-bench-hop-") as tmp:
        key = secrets.token_hex(32)
        key_file = Path(tmp) / "engine.key"
        write_owner_only(key_file, (key + "\n").encode())
        spec = EngineSpec(model_id="smollm2", model_path=model_path, port=free_port(), key_file=key_file, slots=1,
                          context_size=1024, threads=threads)
        proc = spawn(runtime.command, spec, Path(tmp) / "llama.log")
        try:
            await wait_http(f"{spec.endpoint}/health", timeout=120.0)
            yield spec.endpoint, key
        finally:
            stop_process(proc)


# --- report --------------------------------------------------------------------------------------------

def report(title: str, results: Results) -> dict[str, dict[str, float]]:
    """Print the table of one part; returns p50 ms by measure and client."""
    names = results.clients
    print(title)
    print(f"{'measure':<22}{'client':<17}{'p50 ms':>9}{'p99 ms':>9}{'p50/h1':>8}{'p99/h1':>8}"
          f"{'paired -h1 ms':>15}{'CPU us/req':>12}")
    p50s: dict[str, dict[str, float]] = {}
    for label, kind, which in MEASURES:
        base = results.values(kind, "h1", which) if "h1" in names else []
        p50s[label] = {}
        for name in names:
            xs = results.values(kind, name, which)
            cpu = results.values(kind, name, "cpu")
            p50, p99 = pct(xs, 0.5) * 1e3, pct(xs, 0.99) * 1e3
            p50s[label][name] = p50
            if base:
                r50, r99 = p50 / (pct(base, 0.5) * 1e3), p99 / (pct(base, 0.99) * 1e3)
                paired = pct([x - b for x, b in zip(xs, base, strict=True)], 0.5) * 1e3
                rel = f"{r50:>8.3f}{r99:>8.3f}{paired:>+15.3f}"
            else:
                rel = f"{'-':>8}{'-':>8}{'-':>15}"
            cpu_text = f"{sum(cpu) / len(cpu) * 1e6:>12.0f}" if which == "full" else f"{'':>12}"
            print(f"{label:<22}{name:<17}{p50:>9.3f}{p99:>9.3f}{rel}{cpu_text}")
    if "h1" in names:
        for other in ("httpx", "httpx-transport"):
            if other in names:
                print(f"h1/{other} p50: " + ", ".join(
                    f"{label} {p50s[label]['h1'] / p50s[label][other]:.3f}" for label, _, _ in MEASURES))
    return p50s


async def run(args: argparse.Namespace) -> None:
    names = [n.strip() for n in args.clients.split(",") if n.strip()]
    unknown = [n for n in names if n not in FACTORIES]
    if unknown:
        sys.exit(f"unknown client(s) {', '.join(unknown)}: use {', '.join(CLIENTS)}")
    if "aiohttp" in names and not aiohttp_installed():
        print(f"aiohttp: {AIOHTTP_MISSING}; measuring the others")
        names.remove("aiohttp")
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    print(f"engine hop clients: {', '.join(names)}; event loop {loop}; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    started = time.monotonic()
    engine_results = fixed_results = None
    if args.engine:
        async with engine(args.threads) as (endpoint, key):
            engine_results = await rounds(names, endpoint, key, count=args.rounds, warmup=args.warmup)
    if args.fixed:
        with fixed_server() as url:
            fixed_results = await rounds(names, url, "fixed-server-key", count=args.fixed_rounds,
                                         warmup=args.fixed_warmup)
    if engine_results is not None:
        p50 = report(f"-- 1. engine: llama-server (SmolLM2-135M Q4_1, threads={args.threads}, 1 slot), "
                     f"{args.rounds} interleaved rounds", engine_results)
        if "h1" in names:
            hop = p50["plain, pooled"]["h1"]
            print(f"the hop's own cost: plain, pooled p50 {hop:.2f} ms with h1; each client's p50 difference "
                  "to h1 as a share of it: " + ", ".join(
                      f"{n} {(p50['plain, pooled'][n] - hop) / hop * 100:+.1f}%" for n in names if n != "h1"))
    if fixed_results is not None:
        report(f"-- 2. fixed: a tiny asyncio server answering at once (llama-server's heads), "
               f"{args.fixed_rounds} interleaved rounds", fixed_results)
    print(f"load average {os.getloadavg()[0]:.2f} at the end; {time.monotonic() - started:.0f} s")


def main() -> None:
    from grid import eventloop

    if sys.argv[1:] == ["serve-fixed"]:
        eventloop.run(serve_fixed())
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=100, help="interleaved measured rounds against llama-server")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured rounds against llama-server first")
    parser.add_argument("--fixed-rounds", type=int, default=1500,
                        help="interleaved measured rounds against the fixed server")
    parser.add_argument("--fixed-warmup", type=int, default=100,
                        help="unmeasured rounds against the fixed server first")
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads (2 cores here)")
    parser.add_argument("--clients", default=",".join(CLIENTS),
                        help=f"comma-separated clients to measure, from {', '.join(CLIENTS)} (h1 is the baseline)")
    parser.add_argument("--no-engine", dest="engine", action="store_false", help="skip the llama-server part")
    parser.add_argument("--no-fixed", dest="fixed", action="store_false", help="skip the fixed-server part")
    args = parser.parse_args()
    args.rounds, args.fixed_rounds = max(1, args.rounds), max(1, args.fixed_rounds)
    args.warmup, args.fixed_warmup = max(0, args.warmup), max(0, args.fixed_warmup)
    eventloop.run(run(args))


if __name__ == "__main__":
    main()
