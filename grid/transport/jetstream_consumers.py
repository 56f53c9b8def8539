"""The JetStream log's live subscriptions: ordered (projections) and durable (commands).

Both are registered with their JetStreamLog, which calls `renew()` after every reconnect: a
restarted server has forgotten ordered consumers (they live in its memory), while durable ones
survive in its store but are checked, and re-created from the same configuration if missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js import api

from grid.events.log import IteratedByNext, LogError, StoredMessage



class SubscriptionOwner(Protocol):
    """What a subscription uses of the JetStreamLog that owns it.

    Structural, so this module need not import grid.transport.jetstream (which imports it): the
    subscriptions are that log's internals, split out only to keep each file readable.
    """

    _js: Any
    _live: Any

    @property
    def client(self) -> Any: ...

    async def _ordered(self, stream: str, *, start_seq: int | None, start_time: Any,
                       subject_filter: str | None) -> Any: ...

log = structlog.get_logger(__name__)

# Between attempts to re-create a consumer while the server is still coming back.
RENEW_RETRY_SECONDS = 0.5


def parse_js_reply(reply: str) -> tuple[int, float, int]:
    """(stream sequence, server timestamp seconds, pending) from a JetStream ack subject."""
    tokens = reply.split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
        return int(tokens[5]), int(tokens[7]) / 1e9, int(tokens[8])
    if len(tokens) >= 11:  # $JS.ACK.<domain>.<acchash>.<stream>.<consumer>.<dlv>.<sseq>.<cseq>.<ts>.<pending>
        return int(tokens[7]), int(tokens[9]) / 1e9, int(tokens[10])
    raise LogError(f"not a JetStream reply subject: {reply!r}")


def _stored(stream: str, msg: Msg) -> StoredMessage:
    seq, ts, _ = parse_js_reply(msg.reply)
    headers = msg.headers
    return StoredMessage(stream, seq, msg.subject, msg.data, ts, headers.get("Nats-Msg-Id") if headers else None,
                         dict(headers) if headers else None)


class OrderedSubscription(IteratedByNext):
    """Ephemeral ordered push consumer; position lives with the caller.

    `renew()` (after a reconnect) retires the current nats-py subscription: the reader first
    drains what it had already received, then subscribes again right after the last message it
    handed out, so a server restart neither loses nor repeats a message.
    """

    def __init__(self, log_: SubscriptionOwner, stream: str, sub: Any, *, start_seq: int | None,
                 start_time: float | None, subject_filter: str | None) -> None:
        self._log = log_
        self._stream = stream
        self._sub: Any = sub
        # The message iterator, not next_msg(): that spawns a task per message (see JetStreamLog.replay).
        self._messages = sub.messages.__aiter__()
        self._start_time = start_time
        self._subject_filter = subject_filter
        # First stream sequence not yet handed out (0: unknown yet, a replay by start time).
        self._next_seq = start_seq or 0
        self._generation = 0  # bumped by every renew(): a consumer made before it is stale
        self._renewing = False
        self._closed = False
        self._retiring: set[asyncio.Task[None]] = set()

    def renew(self) -> None:
        if self._closed:
            return
        self._generation += 1
        self._renewing = True
        if self._sub is not None:
            self._retire(self._sub)

    def _retire(self, sub: Any) -> None:
        # Unsubscribing ends the message iterator once its queue is drained; done in a task
        # because renew() runs inside nats-py's reconnect callback.
        task = asyncio.get_running_loop().create_task(unsubscribe(sub))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _resubscribe(self, deadline: float | None) -> bool:
        """A fresh consumer after the last message handed out; False when the deadline passed."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            generation = self._generation
            try:
                sub = await self._log._ordered(
                    self._stream,
                    start_seq=self._next_seq if self._next_seq else None,
                    start_time=None if self._next_seq else self._start_time,
                    subject_filter=self._subject_filter,
                )
            except (nats.errors.Error, asyncio.TimeoutError) as exc:
                if self._log.client.is_closed:
                    return False
                log.warning("ordered consumer not re-created yet; retrying", stream=self._stream,
                            from_seq=self._next_seq, error=f"{type(exc).__name__}: {exc}")
                pause = RENEW_RETRY_SECONDS
                if deadline is not None:
                    pause = min(pause, deadline - loop.time())
                    if pause <= 0:
                        return False
                await asyncio.sleep(pause)
                continue
            if generation != self._generation:  # another reconnect while creating it
                self._retire(sub)
                continue
            self._sub = sub
            self._messages = sub.messages.__aiter__()
            self._renewing = False
            log.info("ordered consumer re-created", stream=self._stream, from_seq=self._next_seq)
            return True
        return False

    async def next(self, timeout: float | None = None) -> StoredMessage | None:
        """The next message; None when `timeout` passed first (or the subscription ended).

        `timeout=0` takes only what has already arrived and never waits: an expired wait on
        nats-py's message iterator can lose a message it took from the queue in the same loop
        iteration, which a follower draining its queue after every message would risk each time."""
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        while True:
            sub = self._sub
            if timeout is not None and timeout <= 0 and (sub is None or sub._pending_queue.empty()):
                return None
            if sub is None:
                if not self._renewing or not await self._resubscribe(deadline):
                    return None
                continue
            queue = sub._pending_queue
            try:
                if not queue.empty():
                    # What has arrived, taken directly: nats-py's iterator spends a task and an
                    # asyncio.wait on every message, most of a follower's cost under a flood.
                    msg = queue.get_nowait()
                    queue.task_done()
                    sub._pending_size -= len(msg.data)
                else:
                    async with asyncio.timeout_at(deadline):
                        msg = await self._messages.__anext__()
            except TimeoutError:
                return None
            except StopAsyncIteration:
                # Retired by renew(), or closed (by us, or by the connection closing).
                self._sub = None
                if self._closed or not self._renewing:
                    return None
                continue
            await _answer_flow_control(self._log.client, sub)
            stored = _stored(self._stream, msg)
            if stored.seq < self._next_seq:
                continue  # already handed out before a renewal
            self._next_seq = stored.seq + 1
            return stored

    async def close(self) -> None:
        self._closed = True
        self._log._live.discard(self)
        if self._sub is not None:
            await unsubscribe(self._sub)


async def _answer_flow_control(nc: Any, sub: Any) -> None:
    """Answer the server's flow-control request as soon as every message before it has been taken.

    An ordered push consumer stops delivering once it has sent a flow-control request, until the
    client answers it. nats-py answers only in `next_msg` or from a task that looks every 250 ms,
    and the message iterator we read with (see `OrderedSubscription`) is neither: a follower that
    kept up was held to one flow-control window per quarter second, a few thousand messages a
    second, and under a flood of one host's messages (issue 36) honest heartbeats queued behind
    the flood on the server for minutes. Answered here, delivery never waits on the poll."""
    jsi = getattr(sub, "_jsi", None)
    if jsi is None or not jsi._fcr:
        return
    if jsi._fciseq - sub._pending_queue.qsize() >= jsi._fcd:
        reply, jsi._fcr, jsi._fcd = jsi._fcr, None, 0
        try:
            await nc.publish(reply)
        except nats.errors.Error:
            pass  # the connection is going; its renewal starts a new consumer


async def unsubscribe(sub: Any) -> None:
    try:
        await sub.unsubscribe()
    except nats.errors.Error:
        pass  # already gone with its connection


class DurableSubscription(IteratedByNext):
    """Durable pull consumer with explicit acks: unacked messages are redelivered.

    The consumer and its acknowledged position live on the server (file storage), so they
    survive a server restart; after a reconnect the next pull checks that the consumer is
    still there and re-creates it from the same configuration if it is not.
    """

    def __init__(self, log_: SubscriptionOwner, stream: str, sub: Any, *, durable: str,
                 config: api.ConsumerConfig) -> None:
        self._log = log_
        self._stream = stream
        self._sub = sub
        self._durable = durable
        self._config = config
        self._verify = False
        self._buffer: list[Msg] = []
        self._unacked: dict[int, Msg] = {}
        self._fetch: asyncio.Future[list[Msg]] | None = None

    def renew(self) -> None:
        self._verify = True

    async def _ensure_consumer(self) -> None:
        js = self._log._js
        try:
            await js.consumer_info(self._stream, self._durable)
        except nats.js.errors.NotFoundError:
            await js.add_consumer(self._stream, config=self._config)
            log.warning("durable consumer was missing; re-created", stream=self._stream, durable=self._durable)
        self._verify = False

    async def next(self, timeout: float | None = None) -> StoredMessage | None:
        if not self._buffer:
            wait = timeout if timeout is not None else 30.0
            if self._verify and self._fetch is None:
                try:
                    await self._ensure_consumer()
                except (nats.errors.Error, asyncio.TimeoutError) as exc:
                    log.warning("durable consumer not checked yet", durable=self._durable,
                                error=f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(min(wait, RENEW_RETRY_SECONDS))
                    return None
            if self._fetch is None:
                # One at a time: a larger batch makes nats-py hold the first message until the
                # batch fills or the timeout passes, delaying commands that are already there.
                self._fetch = asyncio.ensure_future(self._sub.fetch(1, timeout=wait))
            # asyncio.wait never swallows our own cancellation (wait_for inside nats-py can,
            # which would leave a stopping caller hung on a pull that never ends). A pull
            # abandoned by a cancelled caller stays referenced and is handed back by close().
            done, _ = await asyncio.wait({self._fetch}, timeout=wait + 1.0)
            if not done:
                return None
            fetch, self._fetch = self._fetch, None
            try:
                self._buffer = list(fetch.result())
            except (nats.errors.TimeoutError, asyncio.TimeoutError, asyncio.CancelledError):
                return None
            except (nats.js.errors.ServiceUnavailableError, nats.js.errors.NotFoundError,
                    nats.errors.NoRespondersError):
                # No consumer answers the pull (deleted, or lost with the server's store).
                self._verify = True
                return None
            if not self._buffer:
                return None  # the server ended the pull request without messages
        msg = self._buffer.pop(0)
        stored = _stored(self._stream, msg)
        self._unacked[stored.seq] = msg
        return stored

    async def ack(self, message: StoredMessage) -> None:
        msg = self._unacked.pop(message.seq, None)
        if msg is not None:
            # Confirmed ack: the caller has finished its side effect and must know the server
            # will not redeliver.
            await msg.ack_sync(timeout=5)

    async def close(self) -> None:
        self._log._live.discard(self)
        # Closing without acking hands the messages back at once instead of after ack_wait.
        fetched: list[Msg] = []
        if self._fetch is not None:
            if self._fetch.done() and not self._fetch.cancelled() and self._fetch.exception() is None:
                fetched = list(self._fetch.result())
            else:
                self._fetch.cancel()
            self._fetch = None
        for msg in [*self._unacked.values(), *self._buffer, *fetched]:
            try:
                await msg.nak()
            except nats.errors.Error:
                pass
        self._unacked.clear()
        self._buffer.clear()
        await unsubscribe(self._sub)

    async def __aiter__(self) -> AsyncIterator[StoredMessage]:
        while True:
            msg = await self.next()
            if msg is None:
                continue
            yield msg
