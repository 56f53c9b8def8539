"""Leaving a NATS server that went silent, promptly, for another node of the cluster.

nats-py notices a silent server (a partition, a hung host) by unanswered pings, then closes the
old transport and awaits that close before it tries another server. Over TLS the close is a
clean TLS shutdown: asyncio sends close_notify and waits for the peer's answer, which a silent
peer never sends, until its 30 s `ssl_shutdown_timeout` gives up ("SSL shutdown timed out").
Every client of a silent node stalled for about 40 s although the other nodes served. Then it
picks the next server at random, so one time in N it is the silent node again, and waits a
whole connect timeout there.

`FailoverClient` is nats-py's client with both mended, and two flaws of its ping bookkeeping
that turn a reconnect or a slow answer into a stall:
- the transport of a connection being left to reconnect is aborted, not shut down cleanly: the
  connection has already failed, and what was not yet written stays in the client's own buffer,
  which nats-py sends again on the next server; an ordinary `close()` still shuts down cleanly,
  for at most CLEAN_CLOSE_SECONDS;
- a reconnect tries the server tried least recently, never the one it just left or just failed
  on while another is known, and waits `reconnect_time_wait` only when it comes back to a server
  it tried that recently;
- a `flush()` in flight when the connection is left is sent again on the new one: nats-py forgets
  the PINGs it was waiting for when it reconnects, so the flush waited out its whole timeout
  (10 s) although the new connection answered at once (seen as a 10 s FlushTimeoutError in a
  controller whose starved connection had missed two 1 s pings);
- a PONG for a flush that already timed out is taken as that flush's answer and dropped:
  nats-py set the result of the timed-out (cancelled) future, which raised in its read loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from typing import Any

from nats.aio.client import DEFAULT_BUFFER_SIZE, Client, Server, Srv
from nats.aio.transport import TcpTransport
from nats.errors import ConnectionClosedError

# A clean close of a healthy connection (TLS close_notify both ways) takes milliseconds; one
# that takes longer is to a peer that will not answer.
CLEAN_CLOSE_SECONDS = 1.0


class PromptCloseTransport(TcpTransport):
    """nats-py's TCP/TLS transport, aborted when its client leaves it to reconnect."""

    def __init__(self, client: Client) -> None:
        super().__init__()
        self._client = weakref.ref(client)

    async def connect_tls(self, uri: Any, ssl_context: Any, buffer_size: int, connect_timeout: int) -> None:
        await super().connect_tls(uri, ssl_context, buffer_size, connect_timeout)
        # nats-py upgrades to TLS with a new StreamReaderProtocol that `loop.start_tls` never hands
        # `connection_made`, so the protocol does not know it runs over TLS: on every EOF the
        # server sends, asyncio warns "returning true from eof_received() has no effect when using
        # ssl". Tell it, as connection_made would have.
        protocol = getattr(self._io_writer, "_protocol", None)
        if isinstance(protocol, asyncio.StreamReaderProtocol):
            protocol._over_ssl = True

    def close(self) -> None:
        client = self._client()
        if client is not None and client.is_reconnecting:
            self.abort()
        else:
            super().close()

    async def wait_closed(self) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(super().wait_closed()), CLEAN_CLOSE_SECONDS)
        except asyncio.TimeoutError:
            self.abort()

    def abort(self) -> None:
        """Drop the connection at once, TLS layer and socket, without waiting for the peer."""
        for writer in (self._io_writer, self._bare_io_writer):
            if writer is not None:
                with contextlib.suppress(RuntimeError):  # its event loop is already closed
                    writer.transport.abort()


class FailoverClient(Client):
    """A nats-py `Client` that leaves a silent server promptly (see the module docstring)."""

    async def connect(self, *args: Any, **options: Any) -> None:
        options.setdefault("reconnect_to_server_handler", self._least_recently_tried)
        await super().connect(*args, **options)

    async def _connect_to_server(self, s: Srv) -> None:
        if s.uri.scheme in ("ws", "wss"):
            await super()._connect_to_server(s)
            return
        # nats-py's own body for TCP, but with our transport: nats-py makes one when it holds
        # none that is connected (an unconnected transport is falsy), and reuses it after.
        s.last_attempt = time.monotonic()
        if not isinstance(self._transport, PromptCloseTransport):
            self._transport = PromptCloseTransport(self)
        await self._transport.connect(s.uri, buffer_size=DEFAULT_BUFFER_SIZE,
                                      connect_timeout=self.options["connect_timeout"])

    def __init__(self) -> None:
        super().__init__()
        # Futures of PINGs sent on a connection that was left, waiting to be sent again.
        self._orphaned_pongs: list[asyncio.Future[Any]] = []

    async def _process_connect_init(self) -> None:
        # nats-py empties `_pongs` here, forgetting flushes that wait for an answer.
        self._orphaned_pongs += [pong for pong in self._pongs if not pong.done()]
        self._pongs = []
        await super()._process_connect_init()

    async def _attempt_reconnect(self) -> None:
        await super()._attempt_reconnect()
        orphans, self._orphaned_pongs = self._orphaned_pongs, []
        for pong in orphans:
            if pong.done():
                continue
            if self.is_connected:
                # After the subscriptions and the buffered data nats-py sent again, so the flush
                # still means "everything before it reached the server".
                await self._send_ping(pong)
            else:
                pong.set_exception(ConnectionClosedError())

    async def _process_pong(self) -> None:
        # PONGs answer PINGs in order: the first waiting future is this PONG's, even if its
        # flush gave up (then nobody waits for it any more).
        if self._pongs and self._pongs[0].done():
            self._pongs.pop(0)
            self._pongs_received += 1
            self._pings_outstanding = 0
            return
        await super()._process_pong()

    def _least_recently_tried(self, servers: list[Server], info: dict[str, Any]) -> tuple[Server | None, float]:
        if not servers:
            return None, 0.0
        attempts = {s.uri.netloc: s.last_attempt for s in self._server_pool}
        current = self._current_server.uri.netloc if self._current_server is not None else None

        def order(server: Server) -> tuple[bool, float]:
            last = attempts.get(server.uri.netloc)
            return server.uri.netloc == current, float("-inf") if last is None else last

        chosen = min(servers, key=order)
        last = attempts.get(chosen.uri.netloc)
        wait = 0.0 if last is None else last + float(self.options["reconnect_time_wait"]) - time.monotonic()
        return chosen, max(0.0, wait)


async def connect_client(**options: Any) -> FailoverClient:
    """`nats.connect`, with a `FailoverClient`."""
    client = FailoverClient()
    await client.connect(**options)
    return client
