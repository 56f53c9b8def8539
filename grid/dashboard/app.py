"""The live dashboard: a JetStream subscriber that pushes its view to browsers over SSE.

One `Dashboard` follows the log with the same projections the controller folds, rebuilds the
pure view (grid.dashboard.view) when something changes (at most a few times a second, and
every couple of seconds anyway so ages stay current), and fans the encoded view out to every
connected page. Browsers never talk to NATS and never compute: they render what arrives.

Access: on loopback the page is open to the machine's own users, like the gateway; on any other
address it needs the operator token or the reader token (GRID_HOME/reader.token, printed by
`gridctl dashboard token`), as Authorization: Bearer, or `?token=` once, which sets an HttpOnly
cookie and redirects so the token does not stay in the address bar or history. The page only
reads, so both credentials see the same; the reader token cannot change anything through the
admin API (grid.controller.api answers 403).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from grid.clock import Clock, SystemClock
from grid.dashboard.view import DashboardView, build_view, encode_view
from grid.demand.forecast import Forecast
from grid.events.log import EventLog
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

ForecastFn = Callable[[dict[str, Any], float], Forecast | None]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Dashboard:
    """Follows the log and keeps the latest encoded view; pages wait on `changed`."""

    def __init__(self, log_: EventLog, *, specs: tuple[ProjectionSpec, ...] = CORE_PROJECTIONS,
                 forecast: ForecastFn | None = None, clock: Clock | None = None) -> None:
        self.log = log_
        self.runner = ProjectionRunner(specs)
        self.forecast = forecast
        self.clock = clock or SystemClock()
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
        self.view = build_view(states, now, forecast=fc, positions=self.runner.positions)
        self.encoded = encode_view(self.view)
        self.version += 1

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

    async def stream(request: Request) -> Response:
        if not authorized(request):
            return denied()
        return StreamingResponse(dashboard.updates(request), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return Starlette(routes=[
        Route("/", index, methods=["GET"]),
        Route("/api/view", view, methods=["GET"]),
        Route("/api/stream", stream, methods=["GET"]),
    ])


def require_token_off_loopback(host: str, token: str | None, reader_token: str | None = None) -> None:
    """Refuse an open dashboard on an address other machines can reach."""
    if not token and not reader_token and not is_loopback(host):
        raise ValueError(f"the dashboard on {host} would be open to the network: give it the operator or reader token")
