"""Start the dashboard beside a running grid: follow the log, forecast like the controller, serve.

`gridctl up` calls `start_dashboard`; the forecast is the controller's own tick input
(grid.controller.tick.tick_input) under the policy the latest plan recorded, so the page shows
the demand the planner plans for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grid.analytics.history import HistoryParams
from grid.analytics.service import AnalyticsUnavailable
from grid.controller.tick import PROJECTIONS, recorded_policy, tick_input
from grid.dashboard.app import Dashboard, HistoryReader, create_dashboard_app, require_token_off_loopback
from grid.demand.forecast import Forecast
from grid.events.log import EventLog
from grid.fleet.planning import Policy
from grid.serving import RunningServer, serve


def plan_policy(states: dict[str, Any]) -> Policy:
    """The policy the latest recorded plan ran under (the default before any plan)."""
    latest = states["plans"].latest
    return Policy() if latest is None else recorded_policy(latest)


def controller_forecast(policy: Policy | None = None) -> Any:
    """A dashboard ForecastFn: the forecast a controller tick at `now` would plan from, under
    `policy` if given, else under the policy the controller recorded with its latest plan."""

    def forecast(states: dict[str, Any], now: float) -> Forecast | None:
        return tick_input(states, now, policy or plan_policy(states)).forecast

    return forecast


def controller_history(controller: Any) -> HistoryReader:
    """A HistoryReader over the analytics store `controller` runs (read at each call: the
    controller may run none, and its store may be reopened while it runs)."""

    async def read(view: str, params: HistoryParams) -> list[dict[str, Any]]:
        service = getattr(controller, "analytics", None)
        if service is None:
            raise AnalyticsUnavailable("this controller runs no analytics store")
        return await service.view(view, params)

    return read


@dataclass
class RunningDashboard:
    dashboard: Dashboard
    server: RunningServer

    @property
    def url(self) -> str:
        return self.server.url

    async def stop(self) -> None:
        await self.server.stop()
        await self.dashboard.stop()


async def start_dashboard(log: EventLog, host: str = "127.0.0.1", port: int = 0, *,
                          token: str | None = None, reader_token: str | None = None,
                          history: HistoryReader | None = None) -> RunningDashboard:
    """Follow `log` and serve the page on host:port, its charts read through `history` (none:
    the page says history is off). Off loopback, the operator `token` and/or the `reader_token`
    is required (either opens the page)."""
    require_token_off_loopback(host, token, reader_token)
    dash = Dashboard(log, specs=PROJECTIONS, forecast=controller_forecast(), history=history)
    await dash.start()
    try:
        server = await serve(create_dashboard_app(dash, token=token, reader_token=reader_token), host, port,
                             name="grid-dashboard")
    except BaseException:
        await dash.stop()
        raise
    return RunningDashboard(dash, server)
