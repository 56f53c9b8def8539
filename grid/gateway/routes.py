"""HTTP handlers: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings, /gateway/*,
/metrics.

The proxy path, in order: client key -> affinity header (hashed at once) -> bounded body ->
typed parse (400 on anything hostile) -> model resolution (`auto` picks the best ready model
for the workload) -> pure route choice (waiting a bounded time for a free slot when every
ready route is full) -> one upstream POST through the host's agent (never replayed) ->
pass-through response (a POST NATS proves undelivered, "no responders", is routed again
without that host) -> breaker, measurements, counters and one telemetry record. Each routing is
one grid.gateway.attempt.Attempt (it holds the route's slot); what each way a forward can fail
means is the table in grid.gateway.failures.

Workload classification: a request for model `auto` is classified before routing (it decides
the model). A direct request is classified only after its response has been sent, off the
latency path; until then the bounded text head stays in memory with the request (as the body
itself does) and is dropped as soon as the class is known. No text is ever stored.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection
from typing import Any

import msgspec
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from grid.demand.workload import classify
from grid.events.control import ModelProfile
from grid.events.requests import RequestFeatures
from grid.gateway import bodies, errors, routing
from grid.gateway.affinity import HEADER as AFFINITY_HEADER
from grid.gateway.affinity import AffinityError, parse_affinity_key, telemetry_hash
from grid.gateway.attempt import Attempt
from grid.gateway.breaker import CALLER_CAUSED_5XX, classify_status
from grid.gateway.evaluation import HEADER as EVALUATION_HEADER
from grid.gateway.failures import READING, SENDING, Failure, failure_of, stream_ending_of
from grid.gateway.responses import STREAM_OK, ProxyStream, RawResponse
from grid.gateway.sse import UsageParser, completion_tokens_of
from grid.gateway.state import Gateway
from grid.gateway.upstream import UpstreamResponse, response_headers

_AFFINITY = AFFINITY_HEADER.encode()
_JSON = [(b"content-type", b"application/json")]
MAX_UPSTREAM_ERROR_BYTES = 1 << 20
# Routings of one request: each "no responders" or agent refusal (never delivered to an engine)
# routes the request again, so this bounds the hosts one request may find gone or not serving.
MAX_ROUTE_ATTEMPTS = 4

# llama-server closes a connection right after a streamed response without saying so; a pooled
# reuse would then fail a POST that must not be replayed. Streams therefore use their own
# connection ("Connection: close"); plain requests keep the shared keep-alive pool.
_PLAIN_HEADERS = [(b"content-type", b"application/json"), (b"accept-encoding", b"identity")]
_STREAM_HEADERS = _PLAIN_HEADERS + [(b"connection", b"close")]

# Names the host whose engine answered (host ids are public in the fleet; never a user's identity).
SERVED_BY_HEADER = b"x-grid-host"

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}


class _ModelCard(msgspec.Struct):
    id: str
    created: int
    object: str = "model"
    owned_by: str = "grid"


class _ModelList(msgspec.Struct):
    data: list[_ModelCard]
    object: str = "list"


class _UpstreamError(msgspec.Struct):
    error: dict[str, Any]


_json = msgspec.json.Encoder()
_upstream_error = msgspec.json.Decoder(_UpstreamError)


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway  # type: ignore[no-any-return]


def _authorized(gw: Gateway, request: Request) -> bool:
    if not gw.api_keys.required:
        return True
    for k, v in request.scope["headers"]:
        if k == b"authorization":
            return gw.api_keys.check(v.decode("latin-1"))
    return False


# --- discovery -----------------------------------------------------------------------------------


def _cards(gw: Gateway, now: float) -> list[_ModelCard]:
    table = gw.table(now)
    cards = []
    for model_id in routing.ready_models(table, now, gw.policy):
        loaded = [c.loaded_at for c in table[model_id] if c.loaded_at is not None and c.state == "ready"]
        cards.append(_ModelCard(id=model_id, created=int(min(loaded)) if loaded else 0))
    return cards


async def list_models(request: Request) -> Any:
    gw = _gateway(request)
    if not _authorized(gw, request):
        return errors.unauthorized()
    return RawResponse(200, list(_JSON), _json.encode(_ModelList(data=_cards(gw, gw.clock.now()))))


async def get_model(request: Request) -> Any:
    gw = _gateway(request)
    if not _authorized(gw, request):
        return errors.unauthorized()
    model_id = request.path_params["model_id"]
    for card in _cards(gw, gw.clock.now()):
        if card.id == model_id:
            return RawResponse(200, list(_JSON), _json.encode(card))
    return errors.model_not_found(model_id)


async def stats(request: Request) -> Any:
    gw = _gateway(request)
    if not _authorized(gw, request):
        return errors.unauthorized()
    return RawResponse(200, list(_JSON), _json.encode(gw.stats()))


async def metrics(request: Request) -> Any:
    """Prometheus exposition; behind the client key when keys are configured (it names models)."""
    gw = _gateway(request)
    if not _authorized(gw, request):
        return errors.unauthorized()
    return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def health(request: Request) -> Any:
    gw = _gateway(request)
    body = {"status": "ok" if gw.started else "starting", "ready_models": len(gw.ready_models(gw.clock.now()))}
    return RawResponse(200 if gw.started else 503, list(_JSON), _json.encode(body))


# --- proxy ---------------------------------------------------------------------------------------


class _Ctx:
    """What one request needs to write its telemetry record (no text kept, no raw key)."""

    __slots__ = (
        "affinity",
        "auto",
        "evaluation",
        "kind",
        "queue_depth",
        "queue_seconds",
        "requested",
        "route",
        "served",
        "stream",
        "t0",
        "text_head",
        "ttft",
        "units",
        "workload",
    )

    def __init__(self, kind: str, requested: str, auto: bool, units: int, affinity: bytes | None,
                 stream: bool) -> None:
        self.kind = kind
        self.requested = requested
        self.served: str | None = None
        self.auto = auto
        self.workload: str | None = None
        self.text_head: str | None = None
        self.units = units
        self.affinity = affinity
        self.stream = stream
        self.evaluation = False
        self.queue_seconds = 0.0
        self.queue_depth = 0
        self.route: routing.RouteCandidate | None = None
        self.t0 = time.perf_counter()
        self.ttft: float | None = None  # seconds from request to the first streamed chunk

    def classify(self) -> str:
        if self.workload is None:
            self.workload = classify(self.kind, self.text_head, "text").workload
            self.text_head = None
        return self.workload


def _record(gw: Gateway, ctx: _Ctx, *, outcome: str, status: int, service: float, output_units: int = 0) -> None:
    route = ctx.route
    features = RequestFeatures(
        endpoint=ctx.kind,
        requested_model=ctx.requested,
        served_model=ctx.served,
        host_id=None if route is None else route.host_id,
        input_units=ctx.units,
        output_units=output_units,
        workload=ctx.classify(),
        service_seconds=round(max(0.0, service), 6),
        queue_seconds=round(ctx.queue_seconds, 6),
        queue_depth=ctx.queue_depth,
        outcome=outcome,  # type: ignore[arg-type]
        status_code=status,
        finished_at=gw.clock.now(),
        auto=ctx.auto,
        affinity=telemetry_hash(ctx.affinity) if (ctx.auto and ctx.affinity is not None) else None,
        artifact_sha256=None if route is None else route.artifact_sha256,
        evaluation=ctx.evaluation,
        streamed=ctx.stream,
    )
    if not gw.telemetry.put(features):
        gw.metrics.telemetry_dropped.inc()
    gw.metrics.record_request(features, ttft_seconds=ctx.ttft)


def _unavailable(gw: Gateway, ctx: _Ctx, status: int, message: str, code: str, retry_after: float) -> Response:
    gw.counters["unavailable"] += 1
    _record(gw, ctx, outcome="unavailable", status=status, service=0.0)
    return errors.error_response(status, message, errors.UNAVAILABLE, code, retry_after=retry_after)


async def _proxy(request: Request, kind: str) -> Any:
    started = time.perf_counter()
    gw = _gateway(request)
    gw.counters["requests"] += 1
    authorization = declared = accept = affinity_raw = evaluation_token = content_type = None
    for k, v in request.scope["headers"]:
        if k == b"authorization":
            authorization = v
        elif k == b"content-type":
            content_type = v
        elif k == EVALUATION_HEADER:
            evaluation_token = v
        elif k == b"content-length":
            declared = v
        elif k == b"accept":
            accept = v if len(v) <= 256 and v.isascii() and b"\r" not in v and b"\n" not in v else None
        elif k == _AFFINITY:
            affinity_raw = v
    if gw.api_keys.required and not gw.api_keys.check(None if authorization is None else authorization.decode("latin-1")):
        gw.counters["unauthorized"] += 1
        return errors.unauthorized()
    if evaluation_token is not None and not gw.owner.check(evaluation_token):
        gw.counters["evaluation_refused"] += 1
        return errors.evaluation_not_allowed()
    affinity = parse_affinity_key(affinity_raw)
    del affinity_raw
    if isinstance(affinity, AffinityError):
        gw.counters["bad_request"] += 1
        return errors.bad_request(affinity.message, code=errors.CODE_INVALID_AFFINITY)
    unsupported = bodies.content_type_error(content_type)
    if unsupported is not None:
        gw.counters["bad_request"] += 1
        return errors.unsupported_media_type(unsupported)
    body = await gw.intake.read(request.receive, declared)
    if not isinstance(body, bytes):
        gw.counters["bad_request"] += 1
        return body
    parsed = bodies.parse(kind, body)
    if isinstance(parsed, bodies.BodyError):
        gw.counters["bad_request"] += 1
        return errors.bad_request(parsed.message, code=parsed.code, param=parsed.param)

    now = gw.clock.now()
    table = gw.table(now)
    profiles = gw.profiles
    model = parsed.model
    auto = model == "auto" and "auto" not in table and "auto" not in profiles
    ctx = _Ctx(kind, model, auto, parsed.input_units, affinity, parsed.stream)
    ctx.evaluation = evaluation_token is not None
    del evaluation_token
    ctx.t0 = started
    ctx.text_head = parsed.text_head
    if auto:
        workload = ctx.classify()
        target = routing.auto_model(workload, profiles, gw.ready_models(now))
        if target is None:
            return _unavailable(
                gw, ctx, 503, f"No ready model serves the '{workload}' workload yet; demand was recorded.",
                errors.CODE_NO_READY_REPLICA, routing.auto_retry_after(workload, profiles),
            )
        try:
            body = bodies.replace_model(body, target)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return errors.bad_request("Request body is not valid JSON.", code=errors.CODE_INVALID_JSON)
    else:
        target = model
        if target not in table and target not in profiles:
            gw.counters["unknown_model"] += 1
            return errors.model_not_found(target)
    ctx.served = target
    profile = profiles.get(target)
    refusal = _profile_refusal(gw, kind, target, profile, parsed)
    if refusal is not None:
        return refusal
    return await _route_and_forward(gw, ctx, kind, target, profile, table, now, body, accept, parsed, affinity)


def _profile_refusal(gw: Gateway, kind: str, target: str, profile: ModelProfile | None,
                     parsed: bodies.Parsed) -> Response | None:
    """The refusal of a request its model's profile says no replica can serve (None: it may be
    served). Refused before any route is chosen, so the caller's mistake never touches an engine
    or its breaker. A model with no profile has unknown capability: its engine decides."""
    if profile is None:
        return None
    if kind == "embeddings" and not profile.embeddings:
        # Capability routing: a chat-only engine would answer 501.
        gw.counters["unsupported_endpoint"] += 1
        return errors.embeddings_not_supported(target)
    if parsed.max_tokens is not None and 0 < profile.context_size < parsed.max_tokens:
        # The profile's context_size is the window each replica is started with (per slot,
        # grid.agent.engines.llama_cpp): no answer can be longer. Like OpenAI's
        # context_length_exceeded.
        gw.counters["context_length_exceeded"] += 1
        return errors.context_length_exceeded(target, parsed.max_tokens_param, profile.context_size)
    return None


async def _route_and_forward(gw: Gateway, ctx: _Ctx, kind: str, target: str, profile: ModelProfile | None,
                             table: Any, now: float, body: bytes, accept: bytes | None, parsed: bodies.Parsed,
                             affinity: Any) -> Any:
    """Choose a route and send the request. When an attempt proves the request reached no engine
    (a reroutable failure), choose again, up to MAX_ROUTE_ATTEMPTS routings: without that host
    after "no responders" (unroutable until it heartbeats again), without that route after the
    agent's "no ready engine here" refusal (for this request only)."""
    prior = profile.expected_service_seconds if profile is not None else None
    attempts = 0
    refused: set[Any] = set()
    while True:
        attempts += 1
        decision, now = await _choose_route(gw, ctx, target, table, now, affinity, parsed.max_tokens, prior,
                                            refused)
        if decision.route is None:
            return _no_route(gw, ctx, decision, target, profile, now)
        answer = await _forward(gw, ctx, decision.route, kind, body, accept, parsed.stream, now,
                                may_retry=attempts < MAX_ROUTE_ATTEMPTS)
        if not isinstance(answer, Failure):
            return answer
        assert answer.reroute_counter is not None
        gw.counters[answer.reroute_counter] += 1
        if answer.refuses_route:
            refused.add(decision.route.key)
        now = gw.clock.now()
        table = gw.table(now)


async def _choose_route(gw: Gateway, ctx: _Ctx, target: str, table: Any, now: float, affinity: Any,
                        max_tokens: int | None, prior: float | None,
                        refused: Collection[Any] = ()) -> tuple[routing.Decision, float]:
    """The route choice, and the time it was made at: while every ready route is at its
    concurrency limit, wait (bounded by the queue timeout and the waiter limit) and choose again.
    `refused`: routes whose agent already refused this request (never chosen for it again)."""
    started_wait: float | None = None
    while True:
        decision = routing.choose(
            table.get(target, ()),
            now=now,
            measurements=gw.measurements.view(),  # type: ignore[arg-type]
            blocked=gw.breakers.blocked(now).union(refused),
            proxy_active=gw.active,
            affinity=affinity,
            max_tokens=max_tokens,
            prior_latency_seconds=prior,
            policy=gw.policy,
        )
        if decision.route is not None or decision.reason != routing.REASON_AT_CAPACITY:
            break
        mono = time.monotonic()
        if started_wait is None:
            started_wait = mono
            ctx.queue_depth = gw.waiters
        remaining = started_wait + gw.settings.queue_timeout_seconds - mono
        if remaining <= 0 or gw.waiters >= gw.settings.max_waiters:
            break
        await gw.wait_for_change(min(remaining, 1.0))
        now = gw.clock.now()
        table = gw.table(now)
    if started_wait is not None:
        ctx.queue_seconds = time.monotonic() - started_wait
    return decision, now


def _no_route(gw: Gateway, ctx: _Ctx, decision: routing.Decision, target: str, profile: Any, now: float) -> Any:
    """The client's answer when no route could be chosen: why, and when to try again."""
    if decision.reason == routing.REASON_AT_CAPACITY:
        return _unavailable(gw, ctx, 503, f"Every replica of '{target}' is at its concurrency limit.",
                            errors.CODE_AT_CAPACITY, 1.0)
    if decision.reason == routing.REASON_CIRCUIT_OPEN:
        return _unavailable(gw, ctx, 503, f"Every replica of '{target}' is failing; retry shortly.",
                            errors.CODE_CIRCUIT_OPEN, gw.breakers.retry_after(list(decision.circuit_blocked), now))
    blocked = gw.unplaceable(profile, now) if profile is not None else None
    if blocked is not None:
        # Not "retry after N s": nothing will change until the profile or the fleet does.
        gw.counters["cannot_be_placed"] += 1
        _record(gw, ctx, outcome="unavailable", status=503, service=0.0)
        return errors.cannot_be_placed(target, blocked.reason, blocked.detail)
    retry = (profile.load_seconds + profile.warm_seconds) if profile is not None \
        else gw.settings.unavailable_retry_seconds
    return _unavailable(gw, ctx, 503, f"The model '{target}' has no ready replica yet; demand was recorded.",
                        errors.CODE_NO_READY_REPLICA, max(1.0, min(300.0, retry)))


async def _forward(gw: Gateway, ctx: _Ctx, route: routing.RouteCandidate, kind: str, body: bytes,
                   accept: bytes | None, stream: bool, now: float, *, may_retry: bool = False) -> Any:
    """Send the request on `route` and answer the client. With `may_retry`, a failure that proves
    the request reached no engine (failures.Failure.reroutable) is returned instead of answered:
    the caller routes the request again."""
    ctx.route = route
    attempt = Attempt(gw, route, now, functools.partial(_record, gw, ctx))
    upstream_pool = gw.upstream
    assert upstream_pool is not None
    try:
        # No Authorization goes upstream: the host's agent adds its own engine key.
        upstream = await upstream_pool.post(
            upstream_pool.route_target(route.host_id, route.model_id, route.endpoint, PATHS[kind]),
            body,
            (_STREAM_HEADERS if stream else _PLAIN_HEADERS) + [(b"accept", accept or b"*/*")],
        )
    except BaseException as exc:
        answer = _settle_failure(attempt, failure_of(SENDING, exc), may_retry=may_retry)
        if answer is None:
            raise
        return answer
    status = upstream.status_code
    attempt.judge(classify_status(status), None)
    if stream and 200 <= status < 300:
        return _relay(gw, ctx, attempt, upstream, status)
    return await _read_answer(gw, attempt, upstream, status)


def _settle_failure(attempt: Attempt, failure: Failure, *, may_retry: bool = False) -> Response | Failure | None:
    """Settle an attempt that failed: the route's breaker and the routing learn what `failure`
    says; then the request is routed again (`failure` is returned: it reached no engine), or
    recorded and answered, or recorded with nothing to answer (None: the caller re-raises)."""
    end = attempt.judge(failure.breaker, failure.excludes_host)
    if may_retry and failure.reroutable:
        attempt.release(end)  # the attempt that answers writes the request's record
        return failure
    attempt.finish(failure.outcome, failure.status, attempt.elapsed())
    return None if failure.code is None else failure.response(attempt.route.model_id)


def _relay(gw: Gateway, ctx: _Ctx, attempt: Attempt, upstream: UpstreamResponse, status: int) -> ProxyStream:
    """Relay a streamed 2xx answer; the attempt is settled when the stream ends."""
    route = attempt.route
    parser = UsageParser()

    def on_done(outcome: str) -> None:
        latency = attempt.elapsed()
        if outcome == STREAM_OK:
            end = gw.clock.now()
            parser.close()
            gw.measurements.record_response(route.key, route.artifact_sha256, latency, parser.completion_tokens, end)
            attempt.finish("ok", status, latency, parser.completion_tokens or 0)
            return
        ending = stream_ending_of(outcome)
        attempt.judge(ending.breaker, ending.excludes_host)
        attempt.finish(ending.outcome, ending.status, latency,
                       (parser.completion_tokens or 0) if ending.counts_output else 0)

    feed = parser.feed

    def on_chunk(chunk: bytes) -> None:
        if ctx.ttft is None:
            ctx.ttft = time.perf_counter() - ctx.t0
        feed(chunk)

    return ProxyStream(status, _served_headers(upstream, route), upstream, on_chunk, on_done)


async def _read_answer(gw: Gateway, attempt: Attempt, upstream: UpstreamResponse, status: int) -> Any:
    """Read a plain answer (an error's body bounded) and pass it on; a 2xx settles the attempt
    once its bytes are on their way to the client."""
    route = attempt.route
    ok = 200 <= status < 300
    try:
        content = await _read_bounded(upstream, None if ok else MAX_UPSTREAM_ERROR_BYTES)
    except BaseException as exc:
        answer = _settle_failure(attempt, failure_of(READING, exc))
        if answer is None:
            raise
        return answer
    finally:
        await upstream.aclose()
    latency = attempt.elapsed()
    if ok:
        def after() -> None:  # bookkeeping after the bytes are on their way to the client
            tokens = completion_tokens_of(content) if b'"usage"' in content else None
            gw.measurements.record_response(route.key, route.artifact_sha256, latency, tokens, gw.clock.now())
            attempt.finish("ok", status, latency, tokens or 0)

        return RawResponse(status, _served_headers(upstream, route), content, after)
    return _upstream_failure(status, content, latency, attempt.finish)


def _served_headers(upstream: UpstreamResponse, route: routing.RouteCandidate) -> list[tuple[bytes, bytes]]:
    """The engine's content headers plus which host served the answer."""
    host = route.host_id.encode("ascii", "backslashreplace")
    if not host.isalnum():  # a header value never carries control characters, whatever a heartbeat said
        host = bytes(c for c in host if 0x20 < c < 0x7F)
    return response_headers(upstream) + [(SERVED_BY_HEADER, host)]


async def _read_bounded(upstream: UpstreamResponse, limit: int | None) -> bytes:
    if limit is None:
        return await upstream.aread()
    chunks: list[bytes] = []
    total = 0
    async for chunk in upstream.aiter_raw():
        total += len(chunk)
        if total > limit:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _upstream_failure(status: int, content: bytes, latency: float, done: Callable[[str, int, float], None]) -> Response:
    """Map an engine's non-2xx answer to what the client sees (never the engine's internals);
    `done` settles the attempt."""
    if status == 429:
        done("rejected", 429, latency)
        return errors.error_response(429, "The engine is rate limiting; retry shortly.", errors.RATE_LIMIT,
                                     "rate_limit_exceeded", retry_after=1.0)
    if status in (401, 403):
        done("error", 502, latency)
        return errors.error_response(502, "The engine refused Grid's engine key.", errors.SERVER_ERROR,
                                     errors.CODE_UPSTREAM_ERROR)
    if status >= 500 and status not in CALLER_CAUSED_5XX:
        code = 503 if status == 503 else 502
        done("error", code, latency)
        return errors.error_response(code, f"The engine failed (HTTP {status}).", errors.SERVER_ERROR,
                                     errors.CODE_UPSTREAM_ERROR, retry_after=1.0 if code == 503 else None)
    # Caller-caused (a 4xx, or 501 for an endpoint this model's engine does not serve): the
    # engine's explanation, rewritten to the OpenAI shape, with its status.
    done("rejected", status, latency)
    try:
        return errors.from_upstream(status, _upstream_error.decode(content).error)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return errors.error_response(status, f"The engine rejected the request (HTTP {status}).",
                                     errors.INVALID_REQUEST, errors.CODE_UPSTREAM_REJECTED)


async def chat_completions(request: Request) -> Any:
    return await _proxy(request, "chat")


async def completions(request: Request) -> Any:
    return await _proxy(request, "completions")


async def embeddings(request: Request) -> Any:
    return await _proxy(request, "embeddings")


def build_routes() -> list[Route]:
    return [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/gateway/stats", stats, methods=["GET"]),
        Route("/gateway/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        return errors.error_response(405, "Method not allowed.", errors.INVALID_REQUEST,
                                     errors.CODE_METHOD_NOT_ALLOWED)
    if exc.status_code == 404:
        return errors.error_response(404, "Not found.", errors.NOT_FOUND, errors.CODE_NOT_FOUND)
    return errors.error_response(exc.status_code, str(exc.detail)[:200], errors.INVALID_REQUEST, None)


async def _internal(request: Request, exc: Exception) -> Response:
    import structlog

    structlog.get_logger(__name__).error("gateway internal error", error=type(exc).__name__)
    return errors.error_response(500, "Internal gateway error.", errors.SERVER_ERROR, errors.CODE_INTERNAL)


def exception_handlers() -> dict[Any, Any]:
    return {HTTPException: _http_exception, Exception: _internal}
