"""The gateway side: an `UpstreamClient` whose wire is NATS request/reply to a host's agent.

Failures surface as the same httpx exceptions the HTTP pools raise, so the proxy's breaker,
"never replay a POST" and error mapping apply unchanged: no agent listening is a connect
error, a silent agent a connect timeout, a gap or an engine failure mid-answer a read error.

With an identity the gateway signs each request (subject + body, grid.identity.signing): the
agent answers only a gateway's signed request, and only under that gateway's own inbox
(grid.identity.replies).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from grid.events.authorship import Authorship
from grid.events.subjects import escape_token, infer_cancel_subject, infer_request_subject
from grid.infer import direct, wire
from grid.infer.local import LocalPort, LocalResponders

log = structlog.get_logger(__name__)

SCHEME = "grid+nats"
# Pauses between publishes answered by "no responders" (None: give up).
NO_RESPONDER_RETRIES: tuple[float | None, ...] = (0.01, 0.05, 0.2, None)


class NoResponders(httpx.ConnectError):
    """NATS answered "no responders": nobody subscribes to the host's inference subject (its
    agent is gone). Proof the request was never delivered, so the gateway may send it to
    another replica without breaking "a delivered POST is never replayed"."""

    def __init__(self, message: str, host_id: str) -> None:
        super().__init__(message)
        self.host_id = host_id


class NotServedThere(httpx.ConnectError):
    """The host's agent refused the request before any engine saw it: it has no ready engine for
    the model (the copy there is draining, or the gateway's view of the host is a heartbeat
    behind). Like "no responders", proof the request was never executed, so the gateway may send
    it to another replica."""

    def __init__(self, message: str, host_id: str, model_id: str) -> None:
        super().__init__(message)
        self.host_id = host_id
        self.model_id = model_id


class UpstreamConnectionLost(httpx.ReadError):
    """The gateway's NATS connection was lost while this request was in flight. Its reply
    cannot arrive any more: a restarted server never delivered the request, so it refuses the
    agent's publish to the reply inbox, and messages sent during the outage are gone. The request
    may have been delivered (and executed), so it is never sent anywhere else."""

    code = "upstream_connection_lost"
    client_message = "The connection to the host serving this model was lost; retry the request."


class EngineStalled(httpx.ReadError):
    """The host's agent ended the answer because its engine stalled: it sent nothing for a while
    and left several health checks in a row unanswered (grid.infer.responder.stall_verdict). The
    agent is alive; its engine is stopped, wedged or dead. The request may have executed, so it is
    never sent anywhere else; the client may retry it, and the agent refuses new requests for that
    engine until it answers again (the gateway then asks another replica)."""

    code = "engine_stalled"
    client_message = "The engine serving this model stopped responding; retry the request."

    def __init__(self, message: str, host_id: str) -> None:
        super().__init__(message)
        self.host_id = host_id


class SilentHost(Exception):
    """The host's agent went silent: it stopped answering within the bound its own evidence sets
    (no first message within the connect timeout, or no progress marker within PROGRESS_MISSES of
    the gaps it promised). Its agent died, was stopped, or lost its path to NATS. The request may
    have been delivered, so it is never sent anywhere else; the client may retry it, and the
    gateway routes the host nothing new until it heartbeats again."""

    code = "upstream_silent"
    client_message = "The host serving this model stopped answering; retry the request."

    def __init__(self, message: str, host_id: str) -> None:
        super().__init__(message)
        self.host_id = host_id


class SilentBeforeAnswer(SilentHost, httpx.ConnectTimeout):
    """No message from the host's agent within the connect timeout."""


class SilentMidAnswer(SilentHost, httpx.ReadTimeout):
    """The agent promised progress markers and sent nothing for several of its gaps."""


# How many of the agent's promised longest gaps (wire.H_PROGRESS) an answer may stay silent
# before it is taken for lost: room for a loaded machine's late wake-ups, and still an end
# within seconds of the host's death.
PROGRESS_MISSES = 4
# The least silence bound, whatever an agent promised (a hostile "0" would only fail its own
# answers, but a bound of zero would fail them before any message could arrive).
MIN_SILENCE_SECONDS = 1.0


# How long this gateway's own server may take to answer a ping once an answer went silent.
PATH_CHECK_SECONDS = 1.0


async def silence_error(nc: NATS, port: LocalPort | None, silent: SilentHost) -> Exception:
    """Whose silence it is. A host is only taken for silent when this gateway's own connection
    answers a ping: when the gateway's node went silent or it is reconnecting, nothing arrives
    from any host, and blaming them would take every host out of routing (the request fails as
    a lost connection instead, never replayed). An in-process answer does not use the connection."""
    if port is not None:
        return silent
    try:
        await asyncio.wait_for(nc.flush(timeout=PATH_CHECK_SECONDS), PATH_CHECK_SECONDS + 0.5)
        return silent
    except Exception:  # a timeout, or no connection to flush on
        return UpstreamConnectionLost(f"{silent}; and this gateway's own NATS connection did not answer a ping")


def silence_bound(headers: Any, read_timeout: float) -> float | None:
    """How long the answer whose message carried `headers` may be silent: PROGRESS_MISSES of the
    agent's promised gap when it promised one, else None (an agent that sends no markers: the
    read timeout applies)."""
    promised = headers.get(wire.H_PROGRESS) if headers else None
    if promised is None:
        return None
    try:
        gap = float(promised)
    except ValueError:
        return None
    if not gap == gap:  # NaN
        return None
    return min(read_timeout, max(MIN_SILENCE_SECONDS, PROGRESS_MISSES * gap))


class InferTarget:
    """One engine reached through its host's agent: host, model and engine path."""

    __slots__ = ("host_id", "model_id", "path", "url")

    def __init__(self, host_id: str, model_id: str, path: str) -> None:
        self.host_id = host_id
        self.model_id = model_id
        self.path = path
        self.url = f"{SCHEME}://{escape_token(host_id)}/{escape_token(model_id)}{path}"

    def __repr__(self) -> str:
        return f"InferTarget({self.url})"


# Messages one answer may have waiting unread before it is cut off as lost (a stalled client).
MAX_PENDING_MESSAGES = 65_536


class _Lost(Exception):
    """Messages of this answer were dropped (its reader fell too far behind)."""


class _ConnectionLost(Exception):
    """The connection this answer was coming on was lost (see `UpstreamConnectionLost`)."""


# Queued after the last message that arrived before the connection was lost.
_LOST_CONNECTION = object()


class _Inbox:
    """The reply messages of one request, fed by the shared subscription (see `_Replies`), or by
    an in-process responder (`in_process`: then no message of the answer crosses NATS)."""

    __slots__ = ("_queue", "_overflow", "_replies", "failed", "in_process", "subject")

    def __init__(self, replies: _Replies, subject: str) -> None:
        self._replies = replies
        self.subject = subject
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._overflow = False
        self.failed = False
        self.in_process = False

    def fail(self) -> None:
        """The connection was lost: once the messages already here are read, reading fails."""
        if not self.failed:
            self.failed = True
            self._queue.put_nowait(_LOST_CONNECTION)

    def put(self, msg: Any) -> None:
        if self.failed:
            return  # nothing after a lost connection belongs to this answer any more
        if self._queue.qsize() >= MAX_PENDING_MESSAGES:
            self._overflow = True  # dropped: the sequence check reports the gap
            return
        self._queue.put_nowait(msg)

    async def next_msg(self, timeout: float) -> Any:
        if not self._queue.empty():  # the common case mid-stream: no timer at all
            msg = self._queue.get_nowait()
        elif self._overflow:
            raise _Lost()
        else:
            async with asyncio.timeout(timeout):  # cheaper than wait_for, which wraps a task
                msg = await self._queue.get()
        if msg is _LOST_CONNECTION:
            self._queue.put_nowait(msg)  # every later read fails the same way
            raise _ConnectionLost()
        return msg

    async def unsubscribe(self) -> None:
        self._replies.boxes.pop(self.subject, None)


class _Replies:
    """One wildcard subscription `<inbox>.*` for the replies of every request on a connection.

    A subscription per request costs a SUB and an UNSUB at the server and their bookkeeping
    in the client on every request; nats-py's own request() multiplexes the same way.
    """

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.prefix = nc.new_inbox()
        self.boxes: dict[str, _Inbox] = {}
        self._sub: Any = None
        self._next = 0

    async def open(self) -> _Inbox:
        if self._sub is None:
            # Each reply goes straight to its inbox's queue (grid.infer.direct).
            self._sub = await direct.subscribe(self.nc, f"{self.prefix}.*", self.deliver)
        self._next += 1
        box = _Inbox(self, f"{self.prefix}.{self._next}")
        self.boxes[box.subject] = box
        return box

    def deliver(self, msg: Any) -> None:
        box = self.boxes.get(msg.subject)
        if box is not None:
            box.put(msg)

    def connection_lost(self) -> int:
        """Fail the answers coming over NATS; an in-process answer does not need the connection,
        so it goes on. Returns how many failed."""
        lost = [box for box in self.boxes.values() if not box.in_process]
        for box in lost:
            box.fail()
        return len(lost)

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None


class NatsResponse:
    """One answer, read from its inbox whether it came over NATS or in process (`port`)."""

    def __init__(self, nc: NATS, target: InferTarget, sub: Any, reply: str, status: int,
                 headers: list[tuple[bytes, bytes]], read_timeout: float, *, first: bytes = b"",
                 ended: bool = False, port: LocalPort | None = None, silence: float | None = None) -> None:
        self._nc = nc
        self._port = port
        self._target = target
        self._sub = sub
        self._reply = reply
        self.status_code = status
        self.raw_headers = headers
        self._read_timeout = read_timeout
        # The agent's promise of progress markers (silence_bound), None when it made none.
        self._silence = silence
        self._next_seq = 1
        # Message 0 may carry the first bytes, or the whole answer (then it also ends it).
        self._first = first
        self._ended = ended
        # Message 0 was the head alone (a streamed answer's, sent before the engine had a token):
        # the first bytes are a wait away (grid.gateway.responses sends the client its head at once).
        self.head_only = not first and not ended
        self._closed = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        if self._first:
            first, self._first = self._first, b""
            yield first
        while not self._ended:
            silence = self._silence
            try:
                msg = await self._sub.next_msg(timeout=self._read_timeout if silence is None else silence)
            except _Lost as exc:
                raise httpx.ReadError(f"{self._target}: lost part of the answer (read too slowly)") from exc
            except _ConnectionLost as exc:
                raise UpstreamConnectionLost(f"{self._target}: the NATS connection was lost mid-answer") from exc
            except Exception as exc:  # a timeout
                if silence is not None:
                    silent = SilentMidAnswer(f"{self._target}: the agent sent nothing for {silence:g}s",
                                             self._target.host_id)
                    raise await silence_error(self._nc, self._port, silent) from exc
                raise httpx.ReadTimeout(f"{self._target}: no data for {self._read_timeout:g}s") from exc
            headers = msg.headers or {}
            if wire.H_WORKING in headers and wire.H_SEQ not in headers:
                continue  # a progress marker: the agent is alive and still has the request
            seq = int(headers.get(wire.H_SEQ, "-1"))
            if seq != self._next_seq:
                if headers.get(wire.H_ERROR) == wire.ERR_CONNECTION_LOST:
                    # The agent lost its connection: what it sent meanwhile never arrived, and
                    # it says why once reconnected. The client gets that reason, not the gap.
                    raise _read_error(self._target, wire.ERR_CONNECTION_LOST)
                raise httpx.ReadError(f"{self._target}: lost part of the answer (got {seq}, wanted {self._next_seq})")
            self._next_seq += 1
            if wire.H_END in headers:
                self._ended = True
                if wire.H_ERROR in headers:
                    raise _read_error(self._target, headers[wire.H_ERROR])
            if msg.data:
                yield msg.data

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._ended:
            # The client left: tell the agent, which drops its engine connection (frees the slot).
            await _cancel(self._nc, self._port, self._target, self._reply)
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()


def _read_error(target: InferTarget, error: str) -> httpx.ReadError:
    """The agent ended an answer with `error` after the request may have reached its engine."""
    if error == wire.ERR_CONNECTION_LOST:
        return UpstreamConnectionLost(f"{target}: {error}")
    if error == wire.ERR_ENGINE_STALLED:
        return EngineStalled(f"{target}: the engine stopped answering its health checks", target.host_id)
    return httpx.ReadError(f"{target}: {error}")


async def _cancel(nc: NATS, port: LocalPort | None, target: InferTarget, reply: str) -> None:
    """Ask the host's agent to stop answering `reply`."""
    if port is not None:
        port.cancel(reply)
        return
    with contextlib.suppress(Exception):
        await nc.publish(infer_cancel_subject(target.host_id), reply.encode("ascii"))


class NatsUpstream:
    """`nc` None (a gateway on the in-memory log) refuses every request as a connect error.
    `signer`: the gateway's identity (its log's authorship), None on a grid without identities.
    `local`: responders in this process (grid.infer.local), tried before NATS."""

    def __init__(self, nc: NATS | None, *, connect_timeout: float = 5.0, read_timeout: float = 600.0,
                 signer: Authorship | None = None, local: LocalResponders | None = None) -> None:
        self.nc = nc
        self.local = local
        # Requests handed to an in-process responder instead of published.
        self.sent_in_process = 0
        self.signer = signer
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._replies = _Replies(nc) if nc is not None else None
        self.connections_lost = 0

    def connection_lost(self) -> None:
        """The NATS connection was lost: fail every request in flight over NATS at once (their
        replies cannot arrive any more) instead of leaving each to its read timeout. Requests
        handed to an in-process responder go on: nothing of theirs crosses NATS, and failing them
        would tie them to an edge they do not depend on (a request taken while the connection
        was already down sees no further edge when the server dies again before the reconnect,
        and would then have been the only one left to its read timeout). Registered with the
        log's disconnect listeners; must not block."""
        if self._replies is not None:
            self.connections_lost += 1
            failed = self._replies.connection_lost()
            if failed:
                log.warning("infer.connection_lost", failed=failed)

    async def post(self, target: InferTarget, body: bytes, headers: list[tuple[bytes, bytes]]) -> NatsResponse:
        nc = self.nc
        if nc is None or nc.is_closed:
            raise httpx.ConnectError(f"{target}: this gateway has no NATS connection to reach hosts through")
        if len(body) > nc.max_payload:
            raise httpx.WriteError(f"request of {len(body)} bytes exceeds the NATS max_payload {nc.max_payload}")
        assert self._replies is not None
        try:
            sub = await self._replies.open()
        except NatsError as exc:  # nothing was published: as safe to report as a refused connect
            raise httpx.ConnectError(f"{target}: NATS refused the reply subscription: {type(exc).__name__}") from exc
        out = {wire.H_PATH: target.path, wire.H_MODEL: target.model_id, wire.H_PROGRESS: "1"}
        for name, value in headers:
            key = name.decode("latin-1").title()
            if key in wire.FORWARDED_REQUEST_HEADERS:
                out[key] = value.decode("latin-1")
        port = self.local.get(target.host_id) if self.local is not None else None
        sub.in_process = port is not None
        try:
            reply = sub.subject
            first = await self._first_answer(target, body, reply, sub, out, port)
            headers_in = first.headers or {}
            if wire.H_ERROR in headers_in:
                if headers_in.get(wire.H_PHASE) == wire.PHASE_CONNECT:
                    raise httpx.ConnectError(f"{target}: {headers_in[wire.H_ERROR]}")
                raise _read_error(target, headers_in[wire.H_ERROR])
            if headers_in.get(wire.H_SEQ) != "0" or wire.H_STATUS not in headers_in:
                raise httpx.RemoteProtocolError(f"{target}: malformed first answer")
            if headers_in.get(wire.H_REFUSED) == wire.ERR_NO_ENGINE and wire.H_END in headers_in:
                raise NotServedThere(f"{target}: the host has no ready engine for {target.model_id!r}",
                                     target.host_id, target.model_id)
            return NatsResponse(nc, target, sub, reply, int(headers_in[wire.H_STATUS]),
                                wire.decode_headers(headers_in.get(wire.H_HEADERS, "[]")), self.read_timeout,
                                first=first.data or b"", ended=wire.H_END in headers_in, port=port,
                                silence=silence_bound(headers_in, self.read_timeout))
        except (UpstreamConnectionLost, SilentHost):
            # The agent may have the request: ask it to stop (sent once reconnected; it also
            # stops a request still in the client's buffer, which is sent just before it, and a
            # stopped agent that resumes drops it).
            await _cancel(nc, port, target, sub.subject)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            raise
        except NatsError as exc:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            # The publish may have left: report it as a read failure (never replayed elsewhere).
            raise httpx.ReadError(f"{target}: NATS failed during the request: {type(exc).__name__}") from exc
        except BaseException:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            raise

    async def _first_answer(self, target: InferTarget, body: bytes, reply: str, sub: Any, headers: dict[str, str],
                            port: LocalPort | None) -> Any:
        """Publish the request (or hand it to the host's in-process responder, `port`) and wait
        for the agent's first message.

        A no-responders status proves the request reached nobody, so publishing it again
        cannot execute it twice. nats-server can report no responders for a moment after a
        subscription was made on another connection (seen here about 1 in 20 times right
        after an agent subscribed), hence a few short retries before calling the host absent.
        """
        assert self.nc is not None
        subject = infer_request_subject(target.host_id)
        if self.signer is not None:
            headers = {**headers, **self.signer.sign(subject, body)}
        for delay in NO_RESPONDER_RETRIES:
            if port is not None:
                # The message NATS would deliver; an in-process responder is always subscribed.
                await port.deliver(Msg(self.nc, subject=subject, reply=reply, data=body, headers=headers), sub)
                self.sent_in_process += 1
            else:
                await self.nc.publish(subject, body, reply=reply, headers=headers)
            try:
                first = await sub.next_msg(timeout=self.connect_timeout)
            except _ConnectionLost as exc:
                raise UpstreamConnectionLost(f"{target}: the NATS connection was lost before the answer") from exc
            except Exception as exc:
                silent = SilentBeforeAnswer(f"{target}: the host's agent did not answer in {self.connect_timeout:g}s",
                                            target.host_id)
                raise await silence_error(self.nc, port, silent) from exc  # type: ignore[arg-type]
            if wire.H_WORKING in (first.headers or {}):
                return await self._after_markers(target, sub, first, port)
            status = (first.headers or {}).get("Status")
            if status != "503" or wire.H_SEQ in (first.headers or {}):
                return first
            if delay is None:
                break
            await asyncio.sleep(delay)
        raise NoResponders(f"{target}: no agent is serving host {target.host_id!r}", target.host_id)

    async def _after_markers(self, target: InferTarget, sub: Any, marker: Any, port: LocalPort | None) -> Any:
        """Message 0, after the agent said the engine is working (a long non-streamed answer):
        from here on the request may have executed, so silence is a read timeout, bounded by the
        agent's promised progress markers when it made that promise."""
        while True:
            silence = silence_bound(marker.headers, self.read_timeout)
            try:
                msg = await sub.next_msg(timeout=self.read_timeout if silence is None else silence)
            except _ConnectionLost as exc:
                raise UpstreamConnectionLost(f"{target}: the NATS connection was lost before the answer") from exc
            except Exception as exc:
                if silence is not None:
                    silent = SilentMidAnswer(f"{target}: the agent sent nothing for {silence:g}s", target.host_id)
                    raise await silence_error(self.nc, port, silent) from exc  # type: ignore[arg-type]
                raise httpx.ReadTimeout(f"{target}: no answer for {self.read_timeout:g}s") from exc
            headers = msg.headers or {}
            if wire.H_WORKING not in headers or wire.H_SEQ in headers:
                return msg
            marker = msg

    async def aclose(self) -> None:
        if self._replies is not None:
            await self._replies.close()

