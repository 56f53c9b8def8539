"""The controller's flap-quarantine gauge: which hosts and models the last tick held out of new
placement, and how long until each releases itself (grid.fleet.quarantine)."""

from __future__ import annotations

from collections.abc import Callable

from grid.fleet.planning import PlannerInput
from grid.metrics import GaugeSource, Sample

NAME = "grid_controller_flap_quarantine_remaining_seconds"


def quarantine_gauge(last_input: Callable[[], PlannerInput | None], now: Callable[[], float]) -> GaugeSource:
    """Read at scrape time from the last tick's planner input (the quarantines its plan obeyed)."""

    def read() -> list[Sample]:
        pin = last_input()
        if pin is None:
            return []
        t = now()
        return [((q.kind, q.subject), max(0.0, q.until - t)) for q in pin.flap_quarantines]

    return GaugeSource(NAME, "Seconds until a flap-quarantined host or model takes new placement again, by kind "
                             "(host|model) and subject.", ("kind", "subject"), read)
