"""Reading a stream forward with batched direct gets: how every identity but the controller reads.

Gateways, operators and readers live in NATS accounts of their own (grid.identity.accounts says
why), which import from GRID only the answers they need. A consumer cannot be one of them: its
configuration names a deliver subject in GRID, and the server would push the stream there. A
batched direct get (`$JS.API.DIRECT.GET.<stream>` with `{"seq": N, "batch": B}`) asks for the
next messages from a position and is answered on the requester's own reply subject: each stored
message with its headers, then a `204 EOB` status (`404` when there is none yet). The position
is ours, so there is nothing on the server to create, lose in a restart or renew.

A live tail is the same read, polled: right away while messages keep coming (the answer says how
many are pending), then at widening intervals up to POLL_MAX_SECONDS while the stream is quiet.
That bounds what a quiet stream costs a reader (a few requests a second) and how late a new
message is seen (at most POLL_MAX_SECONDS after a quiet spell, at once under load).
"""

from __future__ import annotations

import asyncio
import calendar
import datetime as dt
import functools
import itertools
from collections import deque
from typing import Any, Protocol

import msgspec
import nats.errors
import structlog

from grid.events.log import IteratedByNext, StoredMessage

log = structlog.get_logger(__name__)

# Messages, and bytes, one direct get may answer with.
BATCH_MESSAGES = 256
BATCH_BYTES = 4 << 20
# How long a quiet stream waits between reads: from POLL_MIN_SECONDS after the last message,
# doubling up to POLL_MAX_SECONDS.
POLL_MIN_SECONDS = 0.01
POLL_MAX_SECONDS = 0.2
# Headers the server adds to a direct get's answer; a consumer delivers a message without them.
_DIRECT_HEADERS = frozenset({"Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp",
                             "Nats-Num-Pending", "Nats-Last-Sequence"})
STATUS = "Status"
END_OF_BATCH = "204"
NOT_FOUND = "404"


class DirectReadOwner(Protocol):
    """What a direct subscription uses of the JetStreamLog that owns it."""

    _live: Any

    @property
    def client(self) -> Any: ...

    @property
    def api_prefix(self) -> str: ...

    @property
    def request_timeout(self) -> float: ...


@functools.lru_cache(maxsize=64)
def _epoch_seconds(whole: str) -> int:
    # Messages of one second share it: parsed once (most of a direct read's cost otherwise).
    return calendar.timegm(dt.datetime.fromisoformat(whole).timetuple())


def stored_time(stamp: str) -> float:
    """Unix seconds of a `Nats-Time-Stamp` (RFC 3339 with nanoseconds), computed as a consumer's
    delivery gives them (integer nanoseconds / 1e9): a replay's plans depend on receipt times,
    and the same message read either way must fold to the same bytes."""
    whole, _, rest = stamp.rstrip("Z").partition(".")
    digits = "".join(itertools.takewhile(str.isdigit, rest))[:9]
    return (_epoch_seconds(whole) * 1_000_000_000 + int(digits.ljust(9, "0"))) / 1e9


def _rfc3339(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat().replace("+00:00", "Z")


class DirectSubscription(IteratedByNext):
    """A stream read forward from a position (a sequence, a time, or the end) by direct gets,
    optionally only the subjects matching `subject_filter`; the same interface as the log's
    ordered subscription (`next`, `ack`, `close`, `renew`, async iteration)."""

    def __init__(self, log_: DirectReadOwner, stream: str, *, source: str, start_seq: int | None,
                 start_time: float | None, subject_filter: str | None) -> None:
        self._log = log_
        self._stream = stream
        # The stream the messages are read from: the stream itself, or its mirror (same sequences).
        self._subject = f"{log_.api_prefix}.DIRECT.GET.{source}"
        self._next_seq = start_seq or 0  # 0: reading from `start_time` until the first message
        self._start_time = start_time
        self._filter = subject_filter
        self._buffer: deque[StoredMessage] = deque()
        self._pending = 0  # what the last answer said remains after it
        self._pause = POLL_MIN_SECONDS
        self._inbox = log_.client.new_inbox()
        self._sub: Any = None
        self._requests = itertools.count()
        self._refusal: str | None = None  # the status the last answer refused with
        self._closed = False

    def renew(self) -> None:
        """Nothing to renew after a reconnect: the position is ours, not a consumer's."""

    async def close(self) -> None:
        self._closed = True
        self._log._live.discard(self)
        if self._sub is not None:
            sub, self._sub = self._sub, None
            sub._pending_queue.put_nowait(None)  # wakes a read waiting on it
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass  # the connection is closing: the subscription goes with it

    async def next(self, timeout: float | None = None) -> StoredMessage | None:
        """The next message; None when `timeout` passed first, or the subscription is closed.
        `timeout=0` hands out only what an earlier read brought and never asks the server."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._closed:
            if self._buffer:
                return self._buffer.popleft()
            if timeout is not None and timeout <= 0:
                return None
            if self._pending == 0 and self._pause > POLL_MIN_SECONDS:
                # Quiet: wait before asking again (the first read after a message asks at once).
                wait = self._pause if deadline is None else min(self._pause, deadline - loop.time())
                if wait <= 0:
                    return None
                await asyncio.sleep(wait)
            if self._closed:
                return None
            got = await self._fetch(deadline)
            self._pause = POLL_MIN_SECONDS if got else min(POLL_MAX_SECONDS, self._pause * 2)
            if not got and deadline is not None and loop.time() >= deadline:
                return None
        return None

    def _request(self) -> bytes:
        body: dict[str, Any] = {"batch": BATCH_MESSAGES, "max_bytes": BATCH_BYTES}
        if self._next_seq:
            body["seq"] = self._next_seq
        else:
            body["start_time"] = _rfc3339(self._start_time or 0.0)
        if self._filter:
            body["next_by_subj"] = self._filter
        return msgspec.json.encode(body)

    async def _fetch(self, until: float | None) -> int:
        """One batch into the buffer; how many messages it brought (0: none yet, or no answer).
        Waits for the answer until the request times out, or `until` (the caller's deadline)."""
        nc = self._log.client
        if self._sub is None:
            self._sub = await nc.subscribe(f"{self._inbox}.*")
        # A reply subject of its own per request: a late answer to an earlier, timed-out one is
        # told apart and dropped.
        reply = f"{self._inbox}.{next(self._requests)}"
        try:
            await nc.publish(self._subject, self._request(), reply=reply)
        except nats.errors.Error as exc:  # disconnected: nats-py buffers, or refuses when closed
            if nc.is_closed:
                self._closed = True
            log.debug("direct get not sent", stream=self._stream, error=f"{type(exc).__name__}: {exc}")
            return 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._log.request_timeout
        if until is not None:
            deadline = min(deadline, until)
        got = 0
        sub = self._sub
        queue = sub._pending_queue
        while True:
            try:
                if not queue.empty():
                    # Taken straight from the subscription's queue: nats-py's next_msg spends a
                    # task and a wait on every message, most of a batch's cost.
                    msg = queue.get_nowait()
                else:
                    async with asyncio.timeout_at(deadline):
                        msg = await queue.get()
                queue.task_done()
                if msg is None:  # closed meanwhile
                    return got
                sub._pending_size -= len(msg.data)
            except TimeoutError:
                # No answer (a leader election, a server restarting): what came is kept, and the
                # next read asks again from after it.
                self._pending = 0
                return got
            if msg.subject != reply:
                continue  # the tail of an earlier request's answer
            headers = msg.headers or {}
            status = headers.get(STATUS)
            if status is not None:
                self._pending = int(headers.get("Nats-Num-Pending", 0) or 0) if status == END_OF_BATCH else 0
                refusal = None if status in (END_OF_BATCH, NOT_FOUND) else status
                if refusal is not None:
                    # Said once per spell (a stream without a leader answers 503 to every poll).
                    (log.debug if refusal == self._refusal else log.warning)(
                        "direct get refused", stream=self._stream, status=status,
                        description=headers.get("Description"))
                self._refusal = refusal
                return got
            stored = StoredMessage(self._stream, int(headers["Nats-Sequence"]), headers["Nats-Subject"], msg.data,
                                   stored_time(headers["Nats-Time-Stamp"]), headers.get("Nats-Msg-Id"),
                                   {k: v for k, v in headers.items() if k not in _DIRECT_HEADERS} or None)
            if stored.seq < self._next_seq:
                continue
            self._next_seq = stored.seq + 1
            self._buffer.append(stored)
            got += 1
