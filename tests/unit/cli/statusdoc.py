"""A minimal `gridctl status --json` document and a capture of how `gridctl status` renders it."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from grid.cli import admin


def host_row(host_id: str = "h1", **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "host_id": host_id, "state": "accepting", "fresh": True, "heartbeat_age_seconds": 1.0,
        "capacity_mb": 8000, "reserved_mb": 0, "unmanaged_mb": 0, "used_mb": 0, "free_mb": 8000,
        "failure_domain": "default", "tags": [], "runtimes": ["llama.cpp"], "residencies": [], "cached": 0,
        "actuator_capabilities": [], "protection_reason": "", "override": None, "warnings": [],
        "revoked": False, "revoked_at": None, "revoked_reason": "",
    }
    row.update(over)
    return row


def status_doc(hosts: list[dict[str, Any]], **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "controller": {"id": "c1", "lease": {"state": "held", "term": 1}},
        "controllers": [], "mode": {"requested": "automatic", "effective": "automatic", "log_durable": True},
        "revisions": {"dirty": 1, "processed": 1, "success": 1}, "last_tick": None, "plan": None,
        "store": None, "hosts": hosts, "models": [], "unplaceable": [], "flap_quarantines": [],
        "workloads": [], "reconciliation": None, "pending_commands": [], "withdrawn_commands": [],
        "unplaced_claims": [], "warnings": [],
    }
    doc.update(over)
    return doc


def rendered(doc: dict[str, Any], monkeypatch) -> tuple[str, str]:
    """(stdout, stderr) of `gridctl status` for `doc`, one table row per line."""
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(admin, "console", Console(file=out, width=100_000, color_system=None))
    monkeypatch.setattr(admin, "err_console", Console(file=err, width=100_000, color_system=None))
    admin.render_status(doc)
    return out.getvalue(), err.getvalue()
