"""The agent side: forward inference requests from NATS to this host's loopback engines.

The engine key is added here, on the engine's own host, and never travels. Only the paths in
`wire.ALLOWED_PATHS` are forwarded, only to an engine this agent runs for the named model;
everything else is answered with an OpenAI-shaped error without touching an engine.

A request is answered only on a reply subject under its requester's own inbox, and, on a grid
with identities, only when a gateway (or the controller) signed it (grid.identity.replies): a
reply subject such as `grid.ctl.mode` would otherwise have the agent publish its answer, with the
host's rights, wherever the requester pointed it, and a host must not make another host serve.
Anything else gets no answer at all: a warning with the reason, and a count.

An answer in flight ends on evidence, never on a timer (see "Engine liveness" below): while its
engine sends nothing, the agent asks the engine whether it is alive, and ends the answer with
`wire.ERR_ENGINE_STALLED` once it stopped answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from grid.events.subjects import infer_cancel_subject, infer_request_subject
from grid.identity.permissions import Role
from grid.identity.replies import check_request
from grid.identity.signing import Verifier
from grid.infer import direct, wire
from grid.infer.local import ReplySink
from grid.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

# Who may ask a host to serve: the gateway, and the controller (which may do anything).
REQUESTER_ROLES = frozenset({Role.GATEWAY, Role.CONTROLLER})

# Engine liveness. Silence alone proves nothing: a long non-streamed answer, a request queued for
# a busy slot and a long prompt evaluation all send nothing for seconds. But llama-server answers
# GET /health from its HTTP threads whatever its slots are doing (measured on this 2-core machine
# with xllamacpp: 20-60 ms with six requests in flight on two HTTP threads, and throughout a 3 s
# prompt evaluation), while a stopped (SIGSTOP), wedged or dead process does not answer at all. So
# an answer is ended only on silence *and* unanswered health checks after it. Other engines count
# as alive when they answer anything on that path (Ollama answers 404): the evidence is that
# their HTTP server runs, not what it says.
HEALTH_PATH = "/health"
# How long an engine may send nothing to an answer before its liveness is checked: two progress
# sweeps (wire.PROGRESS_MAX_GAP_SECONDS, the same silence after which the requester is promised
# a marker). A streamed answer gets a token every few tens of ms, so no probe runs while bytes
# flow; shorter would probe for every non-streamed answer over a second, longer only delays the
# end of an answer whose engine stopped.
STALL_SILENCE_SECONDS = wire.PROGRESS_MAX_GAP_SECONDS
# How long a health check may take before it counts as unanswered: 30x the slowest answer
# measured from a busy engine (60 ms), room for a loaded machine's scheduling.
PROBE_TIMEOUT_SECONDS = 2.0
# One check per engine per interval, shared by every answer waiting on that engine (the start of
# one check to the start of the next): with the timeout equal, a stopped engine's checks fail
# back to back.
PROBE_INTERVAL_SECONDS = PROBE_TIMEOUT_SECONDS
# Consecutive unanswered checks, all after the answer's last evidence of life, that make an
# engine stalled: one late answer (a hiccup of a loaded machine) is never enough; three in a row
# span six seconds.
STALL_PROBES = 3
# The longest an answer waits on an engine that stopped right after its last bytes: the silence
# noticed (at most a sweep late), then STALL_PROBES checks, each over in at most an interval.
# About 9 s: under the ~10-15 s the grid promises for a request in flight, and well beyond the
# gateway's own bound on a silent host (its markers keep coming until then).
STALL_BOUND_SECONDS = (wire.PROGRESS_SWEEP_SECONDS + STALL_SILENCE_SECONDS
                       + STALL_PROBES * max(PROBE_INTERVAL_SECONDS, PROBE_TIMEOUT_SECONDS))

# What the evidence says about the engine an answer waits on (stall_verdict).
ENGINE_FLOWING = "flowing"  # it sent bytes within STALL_SILENCE_SECONDS: nothing to check
ENGINE_UNPROVEN = "unproven"  # silent, and too few checks since (or the latest failed): check it
ENGINE_ALIVE = "alive"  # silent, but its latest check since answered: busy, not stalled
ENGINE_STALLED = "stalled"  # silent, and its last STALL_PROBES checks since all went unanswered


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One health check of an engine: when it started (loop time) and whether it was answered."""

    started_at: float
    answered: bool


def stall_verdict(last_heard: float, probes: Sequence[ProbeResult], now: float) -> str:
    """The verdict on the engine an answer waits on, from the last evidence that engine had the
    answer and was working (`last_heard`: the answer's arrival or the engine's last bytes,
    whichever is later), the engine's health checks in the order they started, and `now`.

    Only checks that started after `last_heard` count: bytes since a failed check prove the
    engine came back."""
    if now - last_heard < STALL_SILENCE_SECONDS:
        return ENGINE_FLOWING
    since = [p for p in probes if p.started_at >= last_heard]
    if since and since[-1].answered:
        return ENGINE_ALIVE
    unanswered = 0
    for probe in reversed(since):
        if probe.answered:
            break
        unanswered += 1
    return ENGINE_STALLED if unanswered >= STALL_PROBES else ENGINE_UNPROVEN


def needs_check(verdict: str) -> bool:
    """Whether an answer with this verdict needs its engine checked: it waits in silence and
    its engine was not judged yet (a flowing one needs nothing, a stalled one is being ended)."""
    return verdict in (ENGINE_UNPROVEN, ENGINE_ALIVE)


EngineProbe = Callable[["EngineRoute"], Awaitable[bool]]


@dataclass(frozen=True)
class EngineRoute:
    """Where this host serves a model: its loopback endpoint and its engine key (None for an
    external engine registered without one: it is then sent no authorization header at all, not
    an empty bearer, which some engines refuse)."""

    endpoint: str
    key: str | None


def engine_request_headers(route: EngineRoute, request_headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """The headers sent to the engine: its key (added here, on its own host), and the few request
    headers the gateway forwards (a connection header only to ask for close)."""
    headers = [(b"authorization", f"Bearer {route.key}".encode("latin-1"))] if route.key else []
    for name in wire.FORWARDED_REQUEST_HEADERS:
        if (value := request_headers.get(name)) is not None:
            if name == wire.H_CONNECTION and value.lower() != "close":
                continue
            headers.append((name.lower().encode("latin-1"), value.encode("latin-1", "replace")))
    return headers


EngineResolver = Callable[[str], EngineRoute | None]


class EngineResponse(Protocol):
    @property
    def status_code(self) -> int: ...

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class EngineClient(Protocol):
    """POST once to a loopback engine (never replayed); failures are httpx exceptions, a
    refused or failed connect being ConnectError / ConnectTimeout."""

    async def post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> EngineResponse: ...

    async def aclose(self) -> None: ...


class HttpxEngineResponse:
    """An httpx response seen as an `EngineResponse` (also the gateway's HTTP hop)."""

    __slots__ = ("_response",)

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    @property
    def status_code(self) -> int:
        return self._response.status_code

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return self._response.headers.raw

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self._response.aiter_raw()

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxEngineClient:
    """The default engine client: an httpx transport used directly (the AsyncClient's layers
    (cookies, redirects, auth, env proxies) do nothing for a loopback engine). The agent passes
    a faster one (grid.agent.engine_client)."""

    def __init__(self, *, connect_timeout: float = 5.0, read_timeout: float = 600.0, max_connections: int = 256) -> None:
        self._transport = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            retries=0,  # a failed POST is never replayed
        )
        self._extensions = {"timeout": httpx.Timeout(connect=connect_timeout, read=read_timeout, write=30.0,
                                                     pool=30.0).as_dict()}

    async def post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> EngineResponse:
        request = httpx.Request("POST", url, content=body, headers=headers, extensions=self._extensions)
        return HttpxEngineResponse(await self._transport.handle_async_request(request))

    async def aclose(self) -> None:
        await self._transport.aclose()


_MAX_GAP = f"{wire.PROGRESS_MAX_GAP_SECONDS:g}"


def _marker(answer: _Answer) -> dict[str, str]:
    """A progress marker's headers (no Grid-Seq: it is not part of the answer's bytes)."""
    return {wire.H_WORKING: "1", wire.H_PROGRESS: _MAX_GAP} if answer.progress else {wire.H_WORKING: "1"}


def _event_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(k.lower() == b"content-type" and v.lower().startswith(b"text/event-stream") for k, v in headers)


def _error_body(message: str, code: str, kind: str = "invalid_request_error") -> bytes:
    return msgspec.json.encode({"error": {"message": message, "type": kind, "param": None, "code": code}})


class _Answer:
    """Whether message 0 of one answer has been (or is being) sent; how many numbered messages
    were sent by now and by the last sweep (for a requester that asked for progress markers
    (wire.H_PROGRESS), a marker goes out when a sweep finds the two equal); and the evidence
    that its engine (`route`) has it: when it arrived, and the sweep that last saw its bytes."""

    __slots__ = ("heard", "model", "progress", "route", "sent", "since", "stalled", "started", "swept")

    def __init__(self, progress: bool = False, route: EngineRoute | None = None, model: str = "",
                 since: float = 0.0) -> None:
        self.started = False
        self.progress = progress
        self.sent = 0
        self.swept = -1  # the first sweep only takes note
        self.route = route
        self.model = model
        self.since = since
        self.heard = -math.inf
        # Its engine was judged stalled: no more markers, the answer is being ended.
        self.stalled = False

    def heard_at(self, now: float) -> float:
        """When its engine last sent it bytes: `now` if some came since the last sweep."""
        return now if self.sent > max(self.swept, 0) else self.heard


class _EngineWatch:
    """The health checks of one engine (by endpoint) while an answer waits on it in silence, or
    while it is judged stalled: one task, one check per interval. It exists while its task runs."""

    __slots__ = ("model", "probes", "route", "stalled", "task")

    def __init__(self, route: EngineRoute, model: str) -> None:
        self.route = route
        self.model = model
        self.probes: deque[ProbeResult] = deque(maxlen=STALL_PROBES)
        self.task: asyncio.Task[None] | None = None
        # Judged stalled: new requests for it are refused (before it sees them) until a check is
        # answered, so the gateway asks another replica instead of waiting on it again.
        self.stalled = False


class InferenceResponder:
    def __init__(self, nc: NATS, host_id: str, resolve: EngineResolver, *,
                 connect_timeout: float = 5.0, read_timeout: float = 600.0, max_in_flight: int = 256,
                 engine_client: EngineClient | None = None, verifier: Verifier | None = None,
                 probe: EngineProbe | None = None) -> None:
        self.nc = nc
        self.host_id = host_id
        self.resolve = resolve
        # The grid's verifier (the agent's log authorship); None on a grid without identities.
        self.verifier = verifier
        self._http: EngineClient = engine_client or HttpxEngineClient(
            connect_timeout=connect_timeout, read_timeout=read_timeout, max_connections=max_in_flight)
        self._active: dict[str, asyncio.Task[None]] = {}
        self._markers: set[asyncio.Future[None]] = set()
        self._subs: list[Any] = []
        self.served = 0
        self.cancelled = 0
        # Answers stopped because this agent's NATS connection was lost (see connection_lost).
        self.lost = 0
        self._lost_replies: set[str] = set()
        # Requests answered with nothing, by reason (grid.identity.replies).
        self.refused: dict[str, int] = {}
        # In-process answers (grid.infer.local): reply subject -> the requester's inbox.
        self._local: dict[str, ReplySink] = {}
        # The last message of an in-process answer, held until its task is done (see _publish).
        self._local_end: dict[str, Msg] = {}
        # Requests that came in process rather than over NATS (also counted in `served`).
        self.delivered_in_process = 0
        # Answers in flight, and the task that sweeps them every PROGRESS_SWEEP_SECONDS (runs only
        # while there are some): progress markers for the requesters that asked for them, and
        # the silence that starts an engine's health checks.
        self._progress: dict[str, _Answer] = {}
        self._sweeper: asyncio.Task[None] | None = None
        # Progress markers sent (beside the single marker every slow first answer gets).
        self.progress_markers = 0
        # Engine liveness: how an engine is checked (`probe`, a GET of HEALTH_PATH by default),
        # the engines being checked, by endpoint, and the answers ended because theirs stalled.
        self._probe: EngineProbe = probe or self.check_engine
        self._probe_transport: httpx.AsyncHTTPTransport | None = None
        self._engines: dict[str, _EngineWatch] = {}
        self._stalled_replies: set[str] = set()
        self.health_probes = 0
        self.health_probes_unanswered = 0
        self.stalled_answers = 0
        # New requests refused because their engine was judged stalled.
        self.refused_stalled = 0

    async def start(self) -> None:
        # Taken as nats-py's reader parses them (grid.infer.direct): admission and starting the
        # answer's task need no task of their own.
        self._subs = [
            await direct.subscribe(self.nc, infer_request_subject(self.host_id), self._take),
            await direct.subscribe(self.nc, infer_cancel_subject(self.host_id), self._take_cancel),
        ]
        await self.nc.flush()  # subscribed on the server before anyone is told we serve

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs = []
        await cancel_and_wait(list(self._active.values()) + ([self._sweeper] if self._sweeper is not None else [])
                              + [w.task for w in self._engines.values()])
        self._engines.clear()
        await self._http.aclose()
        if self._probe_transport is not None:
            await self._probe_transport.aclose()

    @property
    def in_flight(self) -> int:
        return len(self._active)

    def _take(self, msg: Msg) -> None:
        check = check_request(self.verifier, msg.subject, msg.data, msg.headers, msg.reply, roles=REQUESTER_ROLES)
        if not check.ok:
            self.refused[check.reason] = self.refused.get(check.reason, 0) + 1
            log.warning("infer.request_refused", reason=check.reason, reply=msg.reply[:80] if msg.reply else None,
                        signer=check.signed.signer or None, role=check.signed.role or None)
            return
        if msg.reply in self._active:
            return
        reply = msg.reply
        task = asyncio.create_task(self._serve(msg), name="infer-forward")
        self._active[reply] = task
        task.add_done_callback(lambda _t: self._done(reply))

    def _done(self, reply: str) -> None:
        self._active.pop(reply, None)
        self._lost_replies.discard(reply)
        self._stalled_replies.discard(reply)
        sink = self._local.pop(reply, None)
        end = self._local_end.pop(reply, None)
        if sink is not None and end is not None:
            sink.put(end)

    async def deliver(self, msg: Msg, sink: ReplySink) -> None:
        """A request from a requester in this process (grid.infer.local): handled exactly as if
        NATS had delivered `msg`, its answer put in `sink` instead of published."""
        if not self._subs:
            return  # stopped: no answer, as on NATS
        self._local[msg.reply] = sink
        self._take(msg)
        if msg.reply not in self._active:  # refused: nothing will be sent
            self._local.pop(msg.reply, None)
        else:
            self.delivered_in_process += 1

    def connection_lost(self) -> None:
        """This agent's NATS connection was lost: stop every answer in flight over NATS (the
        engine stops generating) instead of generating for nobody. Their replies could not
        arrive anyway: a restarted server refuses a reply to a request it never delivered, and
        the gateway fails its requests when its own connection goes. In-process answers go on:
        they reach their requester without NATS. Registered with the log's disconnect
        listeners; must not block."""
        stopped = 0
        for reply, task in list(self._active.items()):
            if reply not in self._lost_replies and reply not in self._local:
                self._lost_replies.add(reply)
                self.lost += 1
                stopped += 1
                task.cancel()
        if stopped:
            log.warning("infer.connection_lost", stopped=stopped)

    def _take_cancel(self, msg: Msg) -> None:
        self.cancel(msg.data.decode("ascii", "replace"))

    def cancel(self, reply: str) -> None:
        """The requester left: stop the answer to `reply` (its engine connection closes)."""
        task = self._active.get(reply)
        if task is not None:
            self.cancelled += 1
            task.cancel()

    def _working(self, reply: str, answer: "_Answer") -> None:
        task = asyncio.ensure_future(self._send_working(reply, answer))
        self._markers.add(task)
        task.add_done_callback(self._markers.discard)

    async def _send_working(self, reply: str, answer: "_Answer") -> None:
        # The check and nats-py's buffering of the publish happen without a pause between them,
        # so a marker is never published after message 0.
        if not answer.started:
            with contextlib.suppress(Exception):
                await self._publish(reply, b"", _marker(answer))

    def _track_progress(self, reply: str, answer: _Answer) -> None:
        self._progress[reply] = answer
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep_progress(), name="infer-progress")

    async def _sweep_progress(self) -> None:
        """Every sweep, a marker for each answer that asked for them and sent nothing since the
        sweep before: the requester's evidence that this agent is alive and its engine still has
        the request (none once its engine was judged stalled). Then the health checks of every
        engine an answer waits on in silence. Ends when no answer is in flight."""
        loop = asyncio.get_running_loop()
        while self._progress:
            await asyncio.sleep(wire.PROGRESS_SWEEP_SECONDS)
            now = loop.time()
            for reply, answer in list(self._progress.items()):
                if answer.sent != answer.swept:
                    if answer.sent > max(answer.swept, 0):
                        answer.heard = now
                    answer.swept = answer.sent
                    continue
                if not answer.progress or answer.stalled:
                    continue
                self.progress_markers += 1
                with contextlib.suppress(Exception):
                    await self._publish(reply, b"", _marker(answer))
            self._check_silent_engines(loop.time())

    def _waiting(self, endpoint: str) -> list[tuple[str, _Answer]]:
        """The answers in flight on the engine at `endpoint` not yet ended as stalled."""
        return [(reply, answer) for reply, answer in self._progress.items()
                if answer.route is not None and answer.route.endpoint == endpoint and not answer.stalled]

    def _verdicts(self, endpoint: str, probes: Sequence[ProbeResult], now: float) -> list[tuple[str, _Answer, str]]:
        """The verdict for each answer waiting on `endpoint`. Bytes to any answer are evidence
        that the engine works, so an answer's last evidence is the later of its own arrival and
        the engine's last bytes to any answer in flight."""
        waiting = self._waiting(endpoint)
        heard = max((answer.heard_at(now) for _, answer in waiting), default=-math.inf)
        return [(reply, answer, stall_verdict(max(answer.since, heard), probes, now)) for reply, answer in waiting]

    def _check_silent_engines(self, now: float) -> None:
        """Start the checks of every engine an answer waits on in silence (one task per engine,
        which runs while that lasts)."""
        seen: set[str] = set()
        for answer in list(self._progress.values()):
            route = answer.route
            if route is None or answer.stalled or route.endpoint in seen or route.endpoint in self._engines:
                continue
            seen.add(route.endpoint)
            if any(needs_check(verdict) for _, _, verdict in self._verdicts(route.endpoint, (), now)):
                watch = self._engines[route.endpoint] = _EngineWatch(route, answer.model)
                watch.task = asyncio.create_task(self._watch_engine(route.endpoint, watch),
                                                 name="infer-engine-health")

    def _needs_check(self, endpoint: str, watch: _EngineWatch, now: float) -> bool:
        if watch.stalled:
            # No answer waits on it any more (new requests are refused): checked until it
            # answers, while it is still where this host serves the model.
            route = self.resolve(watch.model)
            return route is not None and route.endpoint == endpoint
        return any(needs_check(verdict) for _, _, verdict in self._verdicts(endpoint, watch.probes, now))

    async def _watch_engine(self, endpoint: str, watch: _EngineWatch) -> None:
        """Check the engine at `endpoint` once per interval while an answer waits on it in
        silence (or while it is judged stalled), judging its answers after each check.

        At most one check per interval, also across watches: this one ends only an interval
        after its last check started, when every answer on the engine had bytes within
        STALL_SILENCE_SECONDS (or none is left), and the next one starts only once an answer has
        been silent that long again."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                started = loop.time()
                try:
                    answered = await self._probe(watch.route)
                except Exception as exc:  # noqa: BLE001 - a check that fails in any way went unanswered
                    log.warning("infer.engine_check_failed", endpoint=endpoint, error=type(exc).__name__)
                    answered = False
                watch.probes.append(ProbeResult(started, answered))
                self.health_probes += 1
                if not answered:
                    self.health_probes_unanswered += 1
                self._judge(endpoint, watch, loop.time())
                await asyncio.sleep(max(0.0, started + PROBE_INTERVAL_SECONDS - loop.time()))
                if not self._needs_check(endpoint, watch, loop.time()):
                    break
        finally:
            # Gone with its task, whatever ended it: should a judged engine's watch end with an
            # error, its requests go to it again and are judged again (never refused for good).
            if self._engines.get(endpoint) is watch:
                del self._engines[endpoint]

    def _judge(self, endpoint: str, watch: _EngineWatch, now: float) -> None:
        """After a check: end every answer whose engine the evidence shows stalled (the engine
        is then judged stalled), or clear that judgement once a check is answered."""
        if watch.probes[-1].answered:
            if watch.stalled:
                watch.stalled = False
                log.info("infer.engine_answers_again", endpoint=endpoint)
            return
        ended = 0
        for reply, answer, verdict in self._verdicts(endpoint, watch.probes, now):
            if verdict != ENGINE_STALLED:
                continue
            # Ended by its own task (its engine connection closes, the requester is told why);
            # no marker goes out for it from here on.
            answer.stalled = True
            self._stalled_replies.add(reply)
            task = self._active.get(reply)
            if task is not None:
                task.cancel()
            ended += 1
        if ended:
            watch.stalled = True
            self.stalled_answers += ended
            log.warning("infer.engine_stalled", endpoint=endpoint, model=watch.model, ended=ended,
                        unanswered_checks=len(watch.probes), check_timeout=PROBE_TIMEOUT_SECONDS)

    async def check_engine(self, route: EngineRoute) -> bool:
        """Whether the engine's HTTP server answers GET HEALTH_PATH within PROBE_TIMEOUT_SECONDS
        (any status: see HEALTH_PATH). A fresh connection every time: a pooled one could be the
        thing that is stuck."""
        if self._probe_transport is None:
            self._probe_transport = httpx.AsyncHTTPTransport(
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=0), retries=0)
        headers = [(b"authorization", f"Bearer {route.key}".encode("latin-1"))] if route.key else []
        request = httpx.Request("GET", route.endpoint.rstrip("/") + HEALTH_PATH, headers=headers,
                                extensions={"timeout": httpx.Timeout(PROBE_TIMEOUT_SECONDS).as_dict()})
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
                response = await self._probe_transport.handle_async_request(request)
                await response.aclose()
        except (httpx.HTTPError, httpx.InvalidURL, TimeoutError, OSError):
            return False
        return True

    async def _send(self, reply: str, seq: int, body: bytes = b"", **headers: str) -> None:
        answer = self._progress.get(reply)
        if answer is not None:
            answer.sent += 1
        await self._publish(reply, body, {wire.H_SEQ: str(seq), **headers})

    async def _publish(self, reply: str, body: bytes, headers: dict[str, str]) -> None:
        sink = self._local.get(reply)
        if sink is None:
            await self.nc.publish(reply, body, headers=headers)
        elif wire.H_END in headers:
            # Handed over once this answer's task is done (engine connection closed or pooled,
            # counters updated): over NATS the broker's hop covers that moment; in process the
            # requester would otherwise see the end while the slot is still held.
            self._local_end[reply] = Msg(self.nc, subject=reply, data=body, headers=headers)
        else:
            # The message NATS would have delivered, without the broker.
            sink.put(Msg(self.nc, subject=reply, data=body, headers=headers))

    async def _end_with(self, reply: str, seq: int, error: str) -> None:
        """Best effort (buffered until reconnected, after a lost connection): the answer ends with
        `error` as message `seq` (0: before any answer, the request may have reached the engine)."""
        with contextlib.suppress(Exception):
            await self._send(reply, seq, **{wire.H_END: "1", wire.H_ERROR: error,
                                            **({} if seq else {wire.H_PHASE: wire.PHASE_READ})})

    async def _end_cancelled(self, reply: str, seq: int) -> None:
        """An answer this responder stopped itself: say why, should the requester still listen."""
        if reply in self._lost_replies:
            await self._end_with(reply, seq, wire.ERR_CONNECTION_LOST)
        elif reply in self._stalled_replies:
            await self._end_with(reply, seq, wire.ERR_ENGINE_STALLED)

    async def _refuse(self, reply: str, status: int, message: str, code: str) -> None:
        headers = wire.encode_headers([(b"content-type", b"application/json")])
        await self._send(reply, 0, _error_body(message, code), **{wire.H_STATUS: str(status), wire.H_HEADERS: headers,
                                                                 wire.H_END: "1", wire.H_REFUSED: code})

    async def _serve(self, msg: Msg) -> None:
        reply = msg.reply
        req_headers = msg.headers or {}
        path = req_headers.get(wire.H_PATH, "")
        model = req_headers.get(wire.H_MODEL, "")
        if path not in wire.ALLOWED_PATHS:
            await self._refuse(reply, 404, f"{path or 'this path'} is not served through Grid", wire.ERR_PATH)
            return
        route = self.resolve(model)
        if route is None:
            await self._refuse(reply, 503, f"{model!r} is not ready on this host", wire.ERR_NO_ENGINE)
            return
        watch = self._engines.get(route.endpoint)
        if watch is not None and watch.stalled:
            # Proof, as for no engine at all, that nothing executed it: the gateway asks another
            # replica rather than waiting on an engine that stopped answering.
            self.refused_stalled += 1
            await self._refuse(reply, 503, f"{model!r} is not ready on this host (its engine stopped answering)",
                               wire.ERR_NO_ENGINE)
            return
        headers = engine_request_headers(route, req_headers)
        answer = _Answer(progress=req_headers.get(wire.H_PROGRESS) == "1", route=route, model=model,
                         since=asyncio.get_running_loop().time())
        # Every answer is swept (its engine's silence is watched); markers only for those that asked.
        self._track_progress(reply, answer)
        # A timer, not a task: nothing extra on the fast path (most answers start well within it).
        # It runs until message 0 is sent (for a streamed answer, its head: a stream queued for
        # a busy slot then waits for its first chunk under the progress markers).
        timer = asyncio.get_running_loop().call_later(wire.WORKING_AFTER_SECONDS, self._working, reply, answer)

        def begin() -> None:
            # Message 0 is about to be sent: a marker task that runs later sends nothing.
            timer.cancel()
            answer.started = True

        try:
            await self._forward(reply, route, path, msg.data, headers, answer, begin)
        finally:
            begin()
            self._progress.pop(reply, None)

    async def _forward(self, reply: str, route: EngineRoute, path: str, body: bytes,
                       headers: list[tuple[bytes, bytes]], answer: "_Answer", begin: Callable[[], None]) -> None:
        """Send the engine's answer as numbered messages; `begin()` right before message 0."""
        seq = 0
        try:
            response = await self._http.post(route.endpoint.rstrip("/") + path, body, headers)
        except asyncio.CancelledError:
            begin()
            await self._end_cancelled(reply, 0)
            raise
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            # The engine is down or refusing connections: nothing reached it, like a failed connect.
            begin()
            await self._send(reply, 0, **{wire.H_END: "1", wire.H_ERROR: f"engine unreachable: {type(exc).__name__}",
                                          wire.H_PHASE: wire.PHASE_CONNECT})
            return
        except httpx.HTTPError as exc:
            # The request may have reached the engine: the gateway must not send it anywhere else.
            begin()
            await self._send(reply, 0, **{wire.H_END: "1", wire.H_ERROR: f"engine failed: {type(exc).__name__}",
                                          wire.H_PHASE: wire.PHASE_READ})
            return
        try:
            raw_headers = response.raw_headers
            head = {wire.H_STATUS: str(response.status_code), wire.H_HEADERS: wire.encode_headers(raw_headers)}
            if answer.progress:
                head[wire.H_PROGRESS] = _MAX_GAP
            chunks = response.aiter_raw()
            if _event_stream(raw_headers):
                # A streamed answer's head goes out alone, as soon as the engine sends it:
                # llama-server sends it at once and its first chunk only once the prompt is
                # evaluated, so the gateway answers its client's head (and the client reads it)
                # while the engine works, and the first token then crosses as a body message
                # only (bench.gateway_overhead: the first token 0.5-1 ms sooner than with the
                # head held back for the first bytes).
                begin()
                await self._send(reply, 0, **head)
                finished = False
            else:
                # Message 0 carries the status, the headers and the first bytes: a whole small
                # answer (a non-streamed completion, an error) in one message.
                first, finished = b"", False
                try:
                    first = await chunks.__anext__()
                except StopAsyncIteration:
                    finished = True
                length = next((v.decode("latin-1") for k, v in raw_headers if k.lower() == b"content-length"), None)
                finished = finished or (length is not None and length.isdigit() and len(first) >= int(length))
                pieces = [first[i:i + wire.CHUNK_BYTES] for i in range(0, len(first), wire.CHUNK_BYTES)] or [b""]
                begin()
                if finished and len(pieces) == 1:
                    await self._send(reply, 0, pieces[0], **head, **{wire.H_END: "1"})
                    self.served += 1
                    async for _ in chunks:  # read to the end so the engine connection is reused
                        pass
                    return
                await self._send(reply, 0, pieces[0], **head)
                for piece in pieces[1:]:
                    seq += 1
                    await self._send(reply, seq, piece)
            if not finished:
                async for chunk in chunks:
                    for i in range(0, len(chunk), wire.CHUNK_BYTES):
                        seq += 1
                        await self._send(reply, seq, chunk[i:i + wire.CHUNK_BYTES])
            await self._send(reply, seq + 1, **{wire.H_END: "1"})
            self.served += 1
        except asyncio.CancelledError:
            started = answer.started
            begin()
            await self._end_cancelled(reply, seq + 1 if started else 0)
            raise
        except httpx.HTTPError as exc:
            if answer.started:
                await self._send(reply, seq + 1, **{wire.H_END: "1", wire.H_ERROR: f"engine failed: {type(exc).__name__}"})
            else:  # failed before its first bytes: the error is message 0
                begin()
                await self._send(reply, 0, **{wire.H_END: "1", wire.H_ERROR: f"engine failed: {type(exc).__name__}",
                                              wire.H_PHASE: wire.PHASE_READ})
        finally:
            # Closing mid-stream (a cancel) drops the engine connection: llama.cpp frees the slot.
            await response.aclose()
