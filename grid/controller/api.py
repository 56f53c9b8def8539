"""Admin HTTP API (Starlette): allocator status and operator mutations.

    GET    /allocator/status            open on loopback; elsewhere needs the operator or reader token
    PUT    /allocator/models/{model_id} body = ModelProfile fields minus model_id -> ProfileSet
    PATCH  /allocator/models/{model_id} only the fields given change (404 when there is no profile)
    DELETE /allocator/models/{model_id} -> ProfileRemoved (durable retirement tombstone)
    PUT    /allocator/mode              {"mode": "observe"|"recommend"|"automatic"} -> ModeSet
    POST   /allocator/tick              -> TickRequested, then one reconciliation pass
    PUT    /allocator/forecast-window   {"bucket_seconds": 1..3600} -> ForecastWindowSet
    GET    /openapi.json                the OpenAPI document (grid.controller.openapi)
    GET    /metrics                     Prometheus exposition (as status: open on loopback only)
    GET    /allocator/hosts/{host}/drain-check  what draining the host would cost (grid.controller.drain_check);
                                        as status: open on loopback, elsewhere the operator or reader token
    GET    /allocator/history/{view}    a history view of the analytics store (operator or reader token);
                                        query: from, to (epoch seconds), bucket, model, changes_only
    POST   /allocator/evaluations       an owner's quality evaluation -> EvaluationRecorded
                                        (grid.controller.evaluations; operator token only)

Each endpoint is a module-level function reading the `AdminContext` (the controller, the tokens,
the body bounds) that `create_admin_app` keeps in ``app.state``; the app itself is only the
route table, the 404 handler and that context. Request bodies and query strings are bounded and
validated in grid.controller.admin_input.
`AdminServer` serves the app with uvicorn in the controller's event loop and records its URL in
GRID_HOME/admin.url while it runs (that is how gridctl finds it).

Mutations need the operator token in ``X-Grid-Allocator-Token`` or ``Authorization: Bearer``
(constant-time compare); a wrong or missing token is 401, the reader token (GRID_HOME/reader.token,
read-only: status, history, metrics) is 403. Bodies are bounded (413). A malformed
body is 422 naming the field at fault, and nothing is appended; so is a profile string, list or
map beyond its bound or an artifact source outside hf/https/http (grid.controller.admin_input).
No path is redirected: `/allocator/models` without an id is a 404 saying where the id goes. Automatic mode is refused with
409 while the event log is not durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from grid.analytics.history import VIEWS as HISTORY_VIEWS
from grid.analytics.history import HistoryError, HistoryParams
from grid.analytics.service import AnalyticsService
from grid.clock import Clock
from grid.config import GridConfig
from grid.controller.admin_input import (
    BODY_TIMEOUT_SECONDS,
    MAX_BODY_BYTES,
    MAX_INCOMPLETE_BODIES,
    BodyError,
    BodyIntake,
    ForecastWindowBody,
    ModeBody,
    ProfileBody,
    ProfilePatch,
    TickBody,
    decode_body,
    history_params,
    patch_decoder,
    profile_decoder,
    merge_profile,
    validate_model_id,
    validate_profile,
)
from grid.controller.drain_check import check_drain
from grid.controller.evaluations import EvaluationBody, evaluation_decoder, to_event, validate_body
from grid.controller.openapi import (
    HOST_ID_MAX_LENGTH,
    EvaluationResponse,
    ForecastWindowResponse,
    HistoryResponse,
    ModeResponse,
    ProfileRetiredResponse,
    ProfileSetResponse,
    TickResponse,
    build_openapi,
)
from grid.controller.reconcile import ReconcileResult
from grid.controller.status import ControllerView, TickReport, build_status
from grid.events.base import Event, new_event_id
from grid.events.control import (
    MAX_FORECAST_BUCKET_SECONDS,
    MIN_FORECAST_BUCKET_SECONDS,
    MODEL_ID_GRAMMAR,
    MODES,
    ForecastWindowSet,
    ModelProfile,
    ModeSet,
    ProfileRemoved,
    ProfileSet,
    TickRequested,
)
from grid.events.log import AppendResult, EventLog, LogError
from grid.http_limits import ListenerLimits, uvicorn_options
from grid.metrics import exposition
from grid.planner.plan import build_plan
from grid.projections.runner import ProjectionRunner
from grid.secrets import load_or_create_secret, tokens_equal, write_owner_only
from grid.transport.embedded import free_port


class AdminTarget(Protocol):
    """What the admin API needs of a controller (grid.controller.service.Controller is one).

    A protocol rather than the service class, so this edge module does not import the service.
    """

    config: GridConfig
    token: str | None
    clock: Clock
    log: EventLog
    runner: ProjectionRunner
    last_result: ReconcileResult | None
    analytics: AnalyticsService | None

    def view(self) -> ControllerView: ...

    async def append_control(self, event: Event) -> AppendResult: ...

    async def tick(self, reason: str = "manual") -> TickReport: ...


MODELS_PATH = "/allocator/models/"


def _path_model_id(request: Request) -> str:
    """The model id exactly as the request path has it. The route's own parameter is not: its
    pattern ends in `$`, which matches before a final line break, so `m%0A` would arrive as `m`."""
    path = request.scope.get("path", "")
    at = path.find(MODELS_PATH)
    return path[at + len(MODELS_PATH):] if at >= 0 else str(request.path_params["model_id"])


class AdminServerError(RuntimeError):
    pass


TOKEN_HEADER = "x-grid-allocator-token"
# The two credentials of the admin API: the operator may do everything, the reader only read.
OPERATOR = "operator"
READER = "reader"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
_CLOSE = {"Connection": "close"}


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(data), status_code=status, media_type="application/json", headers=headers)


def _error(status: int, error: str, detail: str, field: str | None = None,
           headers: dict[str, str] | None = None) -> Response:
    if status == 408 or error == "too_many_incomplete_requests":
        headers = {**(headers or {}), **_CLOSE}
    body: dict[str, Any] = {"error": error, "detail": detail}
    if field is not None:
        body["field"] = field
    return _json(body, status, headers)


# --- the app's context ------------------------------------------------------------------------


@dataclass(frozen=True)
class AdminContext:
    """What every endpoint reads, fixed when the app is made (kept in ``app.state.admin``)."""

    controller: AdminTarget
    token: str
    reader_token: str
    admin_url: str | None
    max_body_bytes: int
    status_requires_token_off_loopback: bool
    intake: BodyIntake
    openapi: bytes

    def now(self) -> float:
        return self.controller.clock.now()

    async def body(self, request: Request) -> bytes:
        """The request body, bounded in size, time and concurrency (raises BodyError)."""
        return await self.intake.read(request, self.max_body_bytes)


def _context(request: Request) -> AdminContext:
    return request.app.state.admin  # type: ignore[no-any-return]


# --- credentials ------------------------------------------------------------------------------


def credential(ctx: AdminContext, request: Request) -> str | None:
    """OPERATOR, READER or None for the token the request carries."""
    supplied = request.headers.get(TOKEN_HEADER)
    if supplied is None:
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            supplied = auth[7:].strip()
    if supplied is None:
        return None
    # Both compared in constant time, whichever matches.
    is_operator = tokens_equal(supplied, ctx.token)
    is_reader = tokens_equal(supplied, ctx.reader_token)
    return OPERATOR if is_operator else READER if is_reader else None


def _may_mutate(ctx: AdminContext, request: Request) -> bool:
    return credential(ctx, request) == OPERATOR


def _may_read(ctx: AdminContext, request: Request) -> bool:
    return credential(ctx, request) is not None


def _loopback(request: Request) -> bool:
    client = request.client
    return client is not None and client.host in LOOPBACK_HOSTS


def _may_read_open(ctx: AdminContext, request: Request) -> bool:
    """Status and metrics: open on loopback (unless configured otherwise), else a token that may read."""
    return not ctx.status_requires_token_off_loopback or _loopback(request) or _may_read(ctx, request)


def _unauthorized(ctx: AdminContext, request: Request) -> Response:
    if credential(ctx, request) == READER:
        return _error(403, "forbidden", "the reader token may only read; this needs the operator token")
    return _error(401, "unauthorized", "operator token required (X-Grid-Allocator-Token or Bearer)",
                  headers={"WWW-Authenticate": "Bearer"})


def _unauthorized_read() -> Response:
    return _error(401, "unauthorized", "operator or reader token required (X-Grid-Allocator-Token or Bearer)",
                  headers={"WWW-Authenticate": "Bearer"})


Endpoint = Callable[[Request], Awaitable[Response]]
Handler = Callable[[Request, AdminContext], Awaitable[Response]]


def _guarded(allowed: Callable[[AdminContext, Request], bool],
             refusal: Callable[[AdminContext, Request], Response]) -> Callable[[Handler], Endpoint]:
    """A Starlette endpoint that answers `refusal` unless `allowed`, else calls the handler with the
    app's context."""
    def wrap(handler: Handler) -> Endpoint:
        @functools.wraps(handler)
        async def endpoint(request: Request) -> Response:
            ctx = _context(request)
            if not allowed(ctx, request):
                return refusal(ctx, request)
            return await handler(request, ctx)
        return endpoint
    return wrap


# Mutations: the operator token only. History: either token. Status and metrics: either token,
# or none from loopback.
operator_only = _guarded(_may_mutate, _unauthorized)
readers_only = _guarded(_may_read, lambda _ctx, _request: _unauthorized_read())
readers_or_loopback = _guarded(_may_read_open, lambda _ctx, _request: _unauthorized_read())


def _refused(exc: BodyError) -> Response:
    return _error(exc.status, exc.error, exc.detail, exc.field)


def _log_unavailable(exc: LogError) -> Response:
    return _error(503, "log_unavailable", str(exc))


async def _append(ctx: AdminContext, event: Event) -> AppendResult | Response:
    """Append a control event, or the 503 naming why the log would not take it."""
    try:
        return await ctx.controller.append_control(event)
    except LogError as exc:
        return _log_unavailable(exc)


# How long a history request waits for the sink to hold what the controller has folded.
HISTORY_WAIT_SECONDS = 3.0
# The window of recent demand shown by status.
STATUS_DEMAND_WINDOW_SECONDS = 3600.0


async def _analytics_summary(service: AnalyticsService | None, now: float) -> dict[str, Any] | None:
    """What status shows of history: the sink's state and the last hour's demand per model."""
    if service is None:
        return None
    summary = service.describe()
    try:
        summary["recent_demand"] = await service.view(
            "demand", HistoryParams(start=now - STATUS_DEMAND_WINDOW_SECONDS))
    except Exception as exc:  # a status must answer even when history cannot
        summary["recent_demand"] = []
        summary["error"] = summary["error"] or f"{type(exc).__name__}: {exc}"
    summary["window_seconds"] = STATUS_DEMAND_WINDOW_SECONDS
    return summary


# --- read endpoints ---------------------------------------------------------------------------


@readers_or_loopback
async def status(request: Request, ctx: AdminContext) -> Response:
    body = build_status(ctx.controller.view(), admin_url=ctx.admin_url)
    body["analytics"] = await _analytics_summary(getattr(ctx.controller, "analytics", None), ctx.now())
    return _json(body)


async def openapi(request: Request) -> Response:
    return Response(_context(request).openapi, media_type="application/json")


@readers_or_loopback
async def metrics(request: Request, ctx: AdminContext) -> Response:
    registry = getattr(getattr(ctx.controller, "metrics", None), "registry", None)
    if registry is None:
        return _error(404, "no_metrics", "this controller keeps no metrics")
    return Response(exposition(registry), media_type=CONTENT_TYPE_LATEST)


def _host_id_error(host_id: str) -> str | None:
    if not host_id or len(host_id) > HOST_ID_MAX_LENGTH or any(c.isspace() or ord(c) < 32 for c in host_id):
        return f"a host id is 1 to {HOST_ID_MAX_LENGTH} characters without whitespace or control characters"
    return None


@readers_or_loopback
async def drain_check(request: Request, ctx: AdminContext) -> Response:
    """What draining the host would cost (grid.controller.drain_check): a what-if plan of the last
    planner input with the host draining, off the event loop (a plan of a large fleet takes a while)."""
    host_id = str(request.path_params["host_id"])
    problem = _host_id_error(host_id)
    if problem is not None:
        return _error(404, "not_found", problem)
    view = ctx.controller.view()
    answer = await asyncio.to_thread(check_drain, view.last_input, host_id,
                                     view.limits.evacuation_deadline_seconds, build_plan)
    return _json(answer)


@readers_only
async def history(request: Request, ctx: AdminContext) -> Response:
    view = request.path_params["view"]
    if view not in HISTORY_VIEWS:
        return _error(404, "unknown_view", f"no history view {view!r}; one of {', '.join(sorted(HISTORY_VIEWS))}",
                      "view")
    try:
        params = history_params(request.query_params)
    except BodyError as exc:
        return _refused(exc)
    service = getattr(ctx.controller, "analytics", None)
    if service is None:
        return _error(503, "analytics_unavailable", "this controller runs no analytics sink")
    # Answer from a store that holds at least what the controller has folded (a chat just
    # made shows up), waiting briefly for the sink's next flush.
    await service.flushed(dict(ctx.controller.runner.positions), timeout=HISTORY_WAIT_SECONDS)
    try:
        rows = await service.view(view, params)
    except HistoryError as exc:
        return _error(422, "validation_error", str(exc))
    return _json(HistoryResponse(view=view, rows=rows))


# --- mutations (operator token only) ----------------------------------------------------------


@operator_only
async def put_model(request: Request, ctx: AdminContext) -> Response:
    model_id = _path_model_id(request)
    try:
        validate_model_id(model_id)
        body = decode_body(profile_decoder, await ctx.body(request))
        profile = validate_profile(model_id, body)
    except BodyError as exc:
        return _refused(exc)
    return await _record_profile(ctx, model_id, profile)


@operator_only
async def patch_model(request: Request, ctx: AdminContext) -> Response:
    """Change only the fields given; the rest of the current profile stays as it is."""
    model_id = _path_model_id(request)
    try:
        validate_model_id(model_id)
        patch = decode_body(patch_decoder, await ctx.body(request))
        current = ctx.controller.runner["catalog"].profiles.get(model_id)
        if current is None:
            return _error(404, "unknown_model", f"no profile for {model_id!r}: create it with PUT", "model_id")
        profile = validate_profile(model_id, merge_profile(current, patch))
    except BodyError as exc:
        return _refused(exc)
    return await _record_profile(ctx, model_id, profile)


async def _record_profile(ctx: AdminContext, model_id: str, profile: ModelProfile) -> Response:
    """Append a validated profile (PUT and PATCH end the same way)."""
    res = await _append(ctx, ProfileSet(event_id=new_event_id(), at=ctx.now(), profile=profile))
    if isinstance(res, Response):
        return res
    return _json(ProfileSetResponse(model_id=model_id, profile=profile, seq=res.seq))


@operator_only
async def delete_model(request: Request, ctx: AdminContext) -> Response:
    model_id = _path_model_id(request)
    try:
        validate_model_id(model_id)
    except BodyError as exc:
        return _refused(exc)
    if model_id not in ctx.controller.runner["catalog"].profiles:
        return _error(404, "unknown_model", f"no profile for {model_id!r}", "model_id")
    res = await _append(ctx, ProfileRemoved(event_id=new_event_id(), at=ctx.now(), model_id=model_id))
    if isinstance(res, Response):
        return res
    return _json(ProfileRetiredResponse(model_id=model_id, retired=True, seq=res.seq))


@operator_only
async def put_mode(request: Request, ctx: AdminContext) -> Response:
    try:
        body = decode_body(_mode_decoder, await ctx.body(request))
    except BodyError as exc:
        return _refused(exc)
    if body.mode not in MODES:
        return _error(422, "validation_error", f"mode must be one of {', '.join(MODES)}", "mode")
    if body.mode == "automatic" and not getattr(ctx.controller.log, "durable", False):
        return _error(409, "log_not_durable",
                      "automatic mode is refused: the event log is not durable (mutations would run "
                      "with non-durable intent)", "mode")
    res = await _append(ctx, ModeSet(event_id=new_event_id(), at=ctx.now(), mode=body.mode))  # type: ignore[arg-type]
    if isinstance(res, Response):
        return res
    return _json(ModeResponse(mode=body.mode, seq=res.seq))


@operator_only
async def put_forecast_window(request: Request, ctx: AdminContext) -> Response:
    try:
        body = decode_body(_forecast_window_decoder, await ctx.body(request))
    except BodyError as exc:
        return _refused(exc)
    seconds = body.bucket_seconds
    if not (math.isfinite(seconds) and MIN_FORECAST_BUCKET_SECONDS <= seconds <= MAX_FORECAST_BUCKET_SECONDS):
        return _error(422, "validation_error", f"bucket_seconds must be between {MIN_FORECAST_BUCKET_SECONDS:g} "
                      f"and {MAX_FORECAST_BUCKET_SECONDS:g}", "bucket_seconds")
    res = await _append(ctx, ForecastWindowSet(event_id=new_event_id(), at=ctx.now(), bucket_seconds=float(seconds)))
    if isinstance(res, Response):
        return res
    return _json(ForecastWindowResponse(bucket_seconds=float(seconds), seq=res.seq))


@operator_only
async def post_tick(request: Request, ctx: AdminContext) -> Response:
    try:
        raw = await ctx.body(request)
        body = decode_body(_tick_decoder, raw) if raw.strip() else TickBody()
    except BodyError as exc:
        return _refused(exc)
    controller = ctx.controller
    try:
        res = await controller.append_control(
            TickRequested(event_id=new_event_id(), at=ctx.now(), reason=body.reason[:200]))
        report = await controller.tick("requested")
    except LogError as exc:
        return _log_unavailable(exc)
    result = controller.last_result
    return _json(TickResponse(
        seq=res.seq, tick=report,
        actions=len(result.actions) if result is not None else 0,
        deferred=len(result.deferred) if result is not None else 0,
    ))


# Quality evidence moves placement: only the owner's operator token may record it.
@operator_only
async def post_evaluation(request: Request, ctx: AdminContext) -> Response:
    try:
        body = decode_body(evaluation_decoder, await ctx.body(request))
        validate_body(body)
        event = to_event(body, ctx.controller.runner["catalog"].profiles.get(body.model_id), ctx.now())
    except BodyError as exc:
        return _refused(exc)
    res = await _append(ctx, event)
    if isinstance(res, Response):
        return res
    return _json(EvaluationResponse(model_id=event.model_id, workload=event.workload, score=event.score,
                                    samples=event.samples, artifact_sha256=event.artifact_sha256, seq=res.seq))


@operator_only
async def missing_model_id(request: Request, ctx: AdminContext) -> Response:
    """`/allocator/models` with no id: what a client makes of `/allocator/models/.` (it removes the
    dot segment). Starlette would redirect it (307) to `/allocator/models/`, inviting the client to
    send its body again to a path that names no model; the answer says where the id goes."""
    return _error(404, "missing_model_id", f"the model id goes in the path: {request.method} "
                  f"{MODELS_PATH}{{model_id}}, where model_id is {MODEL_ID_GRAMMAR}", "model_id")


async def not_found(_request: Request, _exc: Exception) -> Response:
    # A path no route matches (for example a model id with a line break, which the path
    # converter does not cross) gets the same JSON error shape as every other refusal.
    return _error(404, "not_found", "no such resource on the admin API")


_mode_decoder = msgspec.json.Decoder(ModeBody)
_tick_decoder = msgspec.json.Decoder(TickBody)
_forecast_window_decoder = msgspec.json.Decoder(ForecastWindowBody)

ROUTES: tuple[Route, ...] = (
    Route("/allocator/status", status, methods=["GET"]),
    Route("/allocator/models/{model_id:path}", put_model, methods=["PUT"]),
    Route("/allocator/models/{model_id:path}", delete_model, methods=["DELETE"]),
    Route("/allocator/models/{model_id:path}", patch_model, methods=["PATCH"]),
    Route(MODELS_PATH.rstrip("/"), missing_model_id, methods=["PUT", "PATCH", "DELETE"]),
    Route("/allocator/mode", put_mode, methods=["PUT"]),
    Route("/allocator/tick", post_tick, methods=["POST"]),
    Route("/allocator/forecast-window", put_forecast_window, methods=["PUT"]),
    Route("/allocator/history/{view}", history, methods=["GET"]),
    Route("/allocator/hosts/{host_id}/drain-check", drain_check, methods=["GET"]),
    Route("/allocator/evaluations", post_evaluation, methods=["POST"]),
    Route("/openapi.json", openapi, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
)


# --- the app ----------------------------------------------------------------------------------


def create_admin_app(
    controller: AdminTarget,
    token: str | None = None,
    *,
    reader_token: str | None = None,
    admin_url: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    status_requires_token_off_loopback: bool = True,
    body_timeout_seconds: float = BODY_TIMEOUT_SECONDS,
    max_incomplete_bodies: int = MAX_INCOMPLETE_BODIES,
) -> Starlette:
    """The admin app of `controller`. Without `token` / `reader_token`, the grid home's operator and
    reader tokens (created if absent)."""
    if token is None:
        token = controller.token or load_or_create_secret(controller.config.operator_token_path)
    if reader_token is None:
        reader_token = load_or_create_secret(controller.config.reader_token_path)
    if not token or not reader_token:
        raise ValueError("the operator and reader tokens must not be empty")
    if tokens_equal(token, reader_token):
        raise ValueError("the reader token must differ from the operator token")
    app = Starlette(routes=list(ROUTES), exception_handlers={404: not_found})
    # No redirects: a 307 to the path with (or without) a final slash asks a client to send its
    # mutation again somewhere it did not name. An unmatched path is the JSON 404 instead.
    app.router.redirect_slashes = False
    app.state.admin = AdminContext(
        controller=controller,
        token=token,
        reader_token=reader_token,
        admin_url=admin_url,
        max_body_bytes=max_body_bytes,
        status_requires_token_off_loopback=status_requires_token_off_loopback,
        intake=BodyIntake(timeout_seconds=body_timeout_seconds, max_incomplete=max_incomplete_bodies),
        openapi=msgspec.json.encode(
            build_openapi(ProfileBody, ModeBody, TickBody, tuple(sorted(HISTORY_VIEWS)), ProfilePatch,
                          evaluation_body=EvaluationBody, forecast_window_body=ForecastWindowBody)),
    )
    return app


class AdminServer:
    """The admin API served by uvicorn in the running event loop (no second thread or process)."""

    def __init__(self, controller: AdminTarget, *, trusted_proxies: tuple[str, ...] = (),
                 limits: ListenerLimits | None = None, **app_options: Any) -> None:
        self.controller = controller
        self.limits = limits  # connection limits (grid.http_limits); None: from the environment
        # Forwarding headers (X-Forwarded-For/-Proto) are honoured only from these addresses; by
        # default from none, so no client can choose the address the loopback check sees.
        self.trusted_proxies = tuple(trusted_proxies)
        self.app_options = app_options
        self.url: str | None = None
        self._server: Any = None
        self._task: asyncio.Task[Any] | None = None

    @property
    def url_file(self) -> Path:
        return self.controller.config.home / "admin.url"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on host:port (0 picks a free port); writes GRID_HOME/admin.url. Returns the URL."""
        import uvicorn

        if port == 0:
            port = free_port(host)
        url_host = f"[{host}]" if ":" in host else host
        url = f"http://{url_host}:{port}"
        config = uvicorn.Config(create_admin_app(self.controller, admin_url=url, **self.app_options), host=host,
                                port=port, log_level="warning", lifespan="off", access_log=False,
                                proxy_headers=bool(self.trusted_proxies),
                                forwarded_allow_ips=list(self.trusted_proxies) or None,
                                **uvicorn_options(self.limits))
        server = uvicorn.Server(config)
        self._server = server
        self._task = asyncio.get_running_loop().create_task(server.serve(), name="controller-admin")
        for _ in range(500):
            if server.started or self._task.done():
                break
            await asyncio.sleep(0.01)
        if not server.started:
            await self.stop()
            raise AdminServerError(f"admin API did not start on {host}:{port}")
        self.url = url
        write_owner_only(self.url_file, (url + "\n").encode())
        return url

    async def stop(self) -> None:
        server, task = self._server, self._task
        self._server = self._task = None
        if server is not None:
            server.should_exit = True
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 5.0)
        if self.url is not None:
            # Another controller may have taken the file over since: remove only our own URL.
            with contextlib.suppress(OSError):
                if self.url_file.read_text().strip() == self.url:
                    self.url_file.unlink()
            self.url = None


async def serve_admin(controller: AdminTarget, host: str = "127.0.0.1", port: int = 0, *,
                      trusted_proxies: tuple[str, ...] = (), limits: ListenerLimits | None = None,
                      **app_options: Any) -> AdminServer:
    """Start an AdminServer for `controller`; stop it with `await server.stop()` before the controller.

    `app_options` go to create_admin_app (body bounds, for example)."""
    server = AdminServer(controller, trusted_proxies=trusted_proxies, limits=limits, **app_options)
    await server.start(host, port)
    return server
