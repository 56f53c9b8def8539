"""The live dashboard: a JetStream subscriber that pushes its view to browsers over SSE.

One `Dashboard` follows the log with the same projections the controller folds, rebuilds the
pure view (grid.dashboard.view) when something changes (at most a few times a second, and
every couple of seconds anyway so ages stay current), and fans the encoded view out to every
connected page. Browsers never talk to NATS and never compute: they render what arrives.

Charts (requests, latency and errors per model, memory per host, demand against forecast) come
from the analytics store through `history` (the history views the controller serves, read in
this process) on `/api/charts`, which the page polls: they change by the minute, not by event.

Access: on loopback the page is open to the machine's own users, like the gateway; on any other
address it needs the operator token or the reader token (GRID_HOME/reader.token, printed by
`gridctl dashboard token`), as Authorization: Bearer, or `?token=` once, which sets an HttpOnly
cookie and redirects so the token does not stay in the address bar or history. The page only
reads, so both credentials see the same; the reader token cannot change anything through the
admin API (grid.controller.api answers 403).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from grid.analytics.history import HistoryParams
from grid.clock import Clock, SystemClock
from grid.dashboard import charts as charts_mod
from grid.dashboard.charts import ForecastSample
from grid.dashboard.view import DashboardView, build_view, encode_view
from grid.demand.forecast import Forecast
from grid.events.log import EventLog
from grid.netaddr import is_loopback
from grid.projections.runner import CORE_PROJECTIONS, ProjectionRunner, ProjectionSpec
from grid.secrets import tokens_equal
from grid.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

COOKIE = "grid_dashboard"
# Pushes are coalesced: a burst of heartbeats becomes one update per interval.
MIN_PUSH_INTERVAL_SECONDS = 0.25
# Ages on the page (heartbeat age, plan age) stay current without any new event.
REFRESH_SECONDS = 2.0
# An SSE comment keeps idle connections open through proxies.
KEEPALIVE_SECONDS = 15.0

# Forecast rates are sampled for the demand chart at most this often, for the longest window a
# chart shows, and for at most this many models (the highest forecast rates) per sample.
FORECAST_SAMPLE_SECONDS = 15.0
FORECAST_SAMPLES = int(charts_mod.MAX_WINDOW_SECONDS / FORECAST_SAMPLE_SECONDS)
FORECAST_SAMPLE_MODELS = 50
# A chart answer is reused this long: many open pages cost one set of queries.
CHARTS_CACHE_SECONDS = 2.0
# Longest text of a store error shown on the page.
DETAIL_CHARS = 200

ForecastFn = Callable[[dict[str, Any], float], Forecast | None]
# Rows of a named history view (grid.analytics.history), e.g. AnalyticsService.view.
HistoryReader = Callable[[str, HistoryParams], Awaitable[list[dict[str, Any]]]]


class Dashboard:
    """Follows the log and keeps the latest encoded view; pages wait on `changed`."""

    def __init__(self, log_: EventLog, *, specs: tuple[ProjectionSpec, ...] = CORE_PROJECTIONS,
                 forecast: ForecastFn | None = None, clock: Clock | None = None,
                 history: HistoryReader | None = None) -> None:
        self.log = log_
        self.runner = ProjectionRunner(specs)
        self.forecast = forecast
        self.history = history
        self.clock = clock or SystemClock()
        self.forecast_samples: collections.deque[ForecastSample] = collections.deque(maxlen=FORECAST_SAMPLES)
        self._charts_cache: dict[tuple[float, int], tuple[float, bytes]] = {}
        self._charts_lock = asyncio.Lock()
        self.view: DashboardView | None = None
        self.encoded: bytes = b"{}"
        self.version = 0
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task[Any]] = []

    async def start(self) -> None:
        await self.runner.catch_up(self.log)
        self._rebuild()
        self._tasks = [
            asyncio.create_task(self.runner.follow(self.log), name="dashboard-follow"),
            asyncio.create_task(self._render_loop(), name="dashboard-render"),
        ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(tasks)

    def _rebuild(self) -> None:
        now = self.clock.now()
        states = self.runner.states
        fc = None
        if self.forecast is not None:
            try:
                fc = self.forecast(states, now)
            except Exception:  # the page still shows hosts and plans without a forecast
                log.warning("dashboard forecast failed", exc_info=True)
        if fc is not None:
            self._sample_forecast(fc, now)
        self.view = build_view(states, now, forecast=fc, positions=self.runner.positions)
        self.encoded = encode_view(self.view)
        self.version += 1

    def _sample_forecast(self, fc: Forecast, now: float) -> None:
        last = self.forecast_samples[-1].at if self.forecast_samples else None
        if last is not None and now - last < FORECAST_SAMPLE_SECONDS:
            return
        busiest = sorted(fc.models, key=lambda m: (-m.rate, m.model_id))[:FORECAST_SAMPLE_MODELS]
        self.forecast_samples.append(ForecastSample(now, {m.model_id: m.rate for m in busiest}))

    async def charts(self, window_seconds: float = charts_mod.DEFAULT_WINDOW_SECONDS,
                     top: int = charts_mod.DEFAULT_TOP) -> bytes:
        """The encoded charts (grid.dashboard.charts) of the window ending now."""
        key = (window_seconds, top)
        async with self._charts_lock:
            cached = self._charts_cache.get(key)
            if cached is not None and time.monotonic() - cached[0] < CHARTS_CACHE_SECONDS:
                return cached[1]
            encoded = charts_mod.encode_charts(await self._read_charts(window_seconds, top))
            self._charts_cache = {k: v for k, v in self._charts_cache.items()
                                  if time.monotonic() - v[0] < CHARTS_CACHE_SECONDS}
            self._charts_cache[key] = (time.monotonic(), encoded)
            return encoded

    async def _read_charts(self, window_seconds: float, top: int) -> charts_mod.ChartsView:
        now = self.clock.now()
        start, end, bucket = charts_mod.window_for(now, window_seconds)
        if self.history is None:
            return charts_mod.unavailable(charts_mod.REASON_NO_HISTORY, "this dashboard runs beside no analytics store",
                                          now=now, start=start, end=end, bucket_seconds=bucket)
        params = HistoryParams(start=start, end=end, bucket_seconds=bucket)
        try:
            demand = await self.history("demand", params)
            memory = await self.history("memory", params)
        except Exception as exc:  # the tables still show; the charts say why they cannot
            log.warning("dashboard charts unavailable", error=f"{type(exc).__name__}: {exc}")
            return charts_mod.unavailable(charts_mod.REASON_HISTORY_UNAVAILABLE,
                                          f"{type(exc).__name__}: {exc}"[:DETAIL_CHARS],
                                          now=now, start=start, end=end, bucket_seconds=bucket)
        return charts_mod.build_charts(demand, memory, tuple(self.forecast_samples), now=now, start=start, end=end,
                                       bucket_seconds=bucket, top=top)

    async def _render_loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.runner.changed.wait(), REFRESH_SECONDS)
            self.runner.changed.clear()
            self._rebuild()
            async with self._changed:
                self._changed.notify_all()
            await asyncio.sleep(MIN_PUSH_INTERVAL_SECONDS)

    async def updates(self, request: Request) -> AsyncIterator[bytes]:
        """SSE frames: the current view now, then each new one, until the client leaves."""
        seen = -1
        while not await request.is_disconnected():
            if self.version != seen:
                seen = self.version
                yield b"event: view\ndata: " + self.encoded + b"\n\n"
                continue
            try:
                async with self._changed:
                    await asyncio.wait_for(self._changed.wait(), KEEPALIVE_SECONDS)
            except asyncio.TimeoutError:
                yield b": keepalive\n\n"


def _index_html() -> bytes:
    return resources.files("grid.dashboard").joinpath("static/index.html").read_bytes()


def create_dashboard_app(dashboard: Dashboard, *, token: str | None, reader_token: str | None = None) -> Starlette:
    """The dashboard's HTTP surface, for the operator `token` or the `reader_token`.

    Neither given means open (only allowed on loopback)."""
    page = _index_html()
    accepted = tuple(t for t in (token, reader_token) if t)

    def matches(supplied: str) -> bool:
        # Every accepted token is compared (constant time each), not only until the first match.
        return sum(tokens_equal(supplied, t) for t in accepted) > 0

    def authorized(request: Request) -> bool:
        if not accepted:
            return True
        header = request.headers.get("authorization", "")
        if header.startswith("Bearer ") and matches(header[7:].strip()):
            return True
        cookie = request.cookies.get(COOKIE)
        return cookie is not None and matches(cookie)

    def denied() -> Response:
        return PlainTextResponse("the dashboard needs the operator or reader token: open it with ?token=<token> "
                                 "(`gridctl dashboard token` prints the reader token)\n",
                                 status_code=401, headers={"WWW-Authenticate": "Bearer"})

    async def index(request: Request) -> Response:
        given = request.query_params.get("token")
        if accepted and given is not None:
            if not matches(given):
                return denied()
            resp = RedirectResponse(request.url.remove_query_params("token"), status_code=303)
            resp.set_cookie(COOKIE, given, httponly=True, samesite="strict")
            return resp
        if not authorized(request):
            return denied()
        return Response(page, media_type="text/html; charset=utf-8",
                        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
                                 "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                                                            "script-src 'self' 'unsafe-inline'; connect-src 'self'"})

    async def view(request: Request) -> Response:
        if not authorized(request):
            return denied()
        return Response(dashboard.encoded, media_type="application/json", headers={"Cache-Control": "no-store"})

    async def charts(request: Request) -> Response:
        if not authorized(request):
            return denied()
        try:
            window = float(request.query_params.get("window", charts_mod.DEFAULT_WINDOW_SECONDS))
            top = int(request.query_params.get("top", charts_mod.DEFAULT_TOP))
        except ValueError:
            return _bad_query()
        if not (math.isfinite(window) and charts_mod.MIN_WINDOW_SECONDS <= window <= charts_mod.MAX_WINDOW_SECONDS
                and 1 <= top <= charts_mod.MAX_TOP):
            return _bad_query()
        return Response(await dashboard.charts(window, top), media_type="application/json",
                        headers={"Cache-Control": "no-store"})

    async def stream(request: Request) -> Response:
        if not authorized(request):
            return denied()
        return StreamingResponse(dashboard.updates(request), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return Starlette(routes=[
        Route("/", index, methods=["GET"]),
        Route("/api/view", view, methods=["GET"]),
        Route("/api/charts", charts, methods=["GET"]),
        Route("/api/stream", stream, methods=["GET"]),
    ])


def _bad_query() -> Response:
    return JSONResponse({"error": "bad_query", "message": (
        f"window must be {charts_mod.MIN_WINDOW_SECONDS:g}..{charts_mod.MAX_WINDOW_SECONDS:g} seconds and top "
        f"1..{charts_mod.MAX_TOP}")}, status_code=422)


def require_token_off_loopback(host: str, token: str | None, reader_token: str | None = None) -> None:
    """Refuse an open dashboard on an address other machines can reach."""
    if not token and not reader_token and not is_loopback(host):
        raise ValueError(f"the dashboard on {host} would be open to the network: give it the operator or reader token")
