"""`gridctl status` says whose machine each host is: a dedicated server, or an employee machine
and how long after its user's input it yields (the host rows' `use`, `yield_to_user_seconds`)."""

from __future__ import annotations

from msgspec import UNSET

from grid.controller.status import _use
from grid.events.host import HostHeartbeat, HostResources, HostUse
from tests.unit.cli.statusdoc import host_row, rendered, status_doc


def _line(out: str, host_id: str) -> str:
    return next(ln for ln in out.splitlines() if host_id in ln)


def test_the_hosts_table_shows_each_machines_use(monkeypatch) -> None:
    doc = status_doc([
        host_row("server", use="dedicated", yield_to_user_seconds=None),
        host_row("laptop", use="employee", yield_to_user_seconds=300.0),
        host_row("desk", use="employee", yield_to_user_seconds=None),  # --yield-to-user 0
        host_row("lab", use="", yield_to_user_seconds=60.0),  # never joined, asked to yield
        host_row("old", use="", yield_to_user_seconds=None),  # says nothing (or an older agent)
        host_row("older-controller"),  # a status document without the fields
    ])
    out, _ = rendered(doc, monkeypatch)
    assert "│ dedicated " in _line(out, "server")
    assert "employee, yields 300s" in _line(out, "laptop")
    assert "employee, never yields" in _line(out, "desk")
    assert "│ yields 60s " in _line(out, "lab")
    assert "│ - " in _line(out, "old") and "│ - " in _line(out, "older-controller")


def test_the_status_row_reads_the_heartbeats_use() -> None:
    hb = HostHeartbeat(event_id="e", at=1.0, host_id="h", resources=HostResources(capacity_mb=1))
    assert hb.use is UNSET
    assert _use(hb) == _use(None) == {"use": "", "yield_to_user_seconds": None}
    employee = HostHeartbeat(event_id="e", at=1.0, host_id="h", resources=HostResources(capacity_mb=1),
                             use=HostUse(dedicated=False, yield_to_user_seconds=300.0))
    assert _use(employee) == {"use": "employee", "yield_to_user_seconds": 300.0}
    server = HostHeartbeat(event_id="e", at=1.0, host_id="h", resources=HostResources(capacity_mb=1),
                           use=HostUse(dedicated=True))
    assert _use(server) == {"use": "dedicated", "yield_to_user_seconds": None}
