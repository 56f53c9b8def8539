"""Analytics always on: the controller runs the DuckDB sink and serves history while it holds the file.

DuckDB admits one writer process and no reader process beside it, so while the controller runs,
`gridctl history` and `gridctl status` must get their history from the controller's admin API;
once it stops, `gridctl history` reads the file read-only.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
import pytest

from grid.controller.api import serve_admin
from grid.controller.service import Controller, ControllerSettings
from grid.events.base import new_event_id
from grid.events.requests import RequestCompleted, RequestFeatures
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.test_cli_admin import gridctl

SETTINGS = ControllerSettings(tick_interval_seconds=0.5, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0, analytics=True)


def _request(model: str, seconds: float) -> RequestCompleted:
    now = time.time()
    return RequestCompleted(event_id=new_event_id(), at=now, features=RequestFeatures(
        endpoint="chat", requested_model=model, served_model=model, host_id="host-1", input_units=10,
        output_units=20, service_seconds=seconds, finished_at=now))


async def test_history_served_by_the_running_controller_then_read_from_the_file(
        js_log: JetStreamLog, tmp_path: Path) -> None:
    home = tmp_path / "home"
    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-analytics")
    await ctl.start()
    admin = await serve_admin(ctl, "127.0.0.1", 0)
    try:
        assert ctl.analytics is not None
        for i in range(3):
            await js_log.append(_request("m-a", 0.1 * (i + 1)))
        await js_log.append(_request("m-b", 0.5))
        # The controller holds the store as its writer: no other process may open it.
        rc, out, err = await gridctl(home, "history", "demand", "--bucket", "0", "--json")
        assert rc == 0, err
        rows = {r["model"]: r for r in json.loads(out)}
        assert rows["m-a"]["requests"] == 3 and rows["m-b"]["requests"] == 1, rows
        rc, out, err = await gridctl(home, "status", "--json")
        assert rc == 0, err
        recent = {r["model"]: r["requests"] for r in json.loads(out)["analytics"]["recent_demand"]}
        assert recent == {"m-a": 3, "m-b": 1}
        rc, out, err = await gridctl(home, "status")
        assert rc == 0 and "Demand, last 60 min" in out and "m-a" in out, out + err
        # Unknown views and parameters are refused; history needs the operator token.
        import httpx
        async with httpx.AsyncClient(base_url=admin.url) as client:
            token = {"X-Grid-Allocator-Token": ctl.token or ""}
            assert (await client.get("/allocator/history/demand")).status_code == 401
            assert (await client.get("/allocator/history/nope", headers=token)).status_code == 404
            bad = await client.get("/allocator/history/demand", params={"from": "yesterday"}, headers=token)
            assert bad.status_code == 422 and bad.json()["field"] == "from"
            bad = await client.get("/allocator/history/demand", params={"drop": "table"}, headers=token)
            assert bad.status_code == 422
    finally:
        await admin.stop()
        await ctl.stop()
    # Stopped: the file is free, and the CLI reads it read-only.
    rc, out, err = await gridctl(home, "history", "demand", "--bucket", "0", "--json")
    assert rc == 0, err
    assert {r["model"]: r["requests"] for r in json.loads(out)} == {"m-a": 3, "m-b": 1}


async def test_store_locked_by_another_process_is_a_clear_error(js_log: JetStreamLog, tmp_path: Path) -> None:
    """A read-only open beside a writer process fails in DuckDB: say so, not 'damaged'."""
    import asyncio
    import sys

    home = tmp_path / "home"
    db = home / "analytics.duckdb"
    home.mkdir()
    duckdb.connect(str(db)).close()
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", f"import duckdb,time; c=duckdb.connect({str(db)!r}); print('held', flush=True); "
                              "time.sleep(30)", stdout=asyncio.subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert (await holder.stdout.readline()).strip() == b"held"
        rc, out, err = await gridctl(home, "history", "demand", "--json")
        assert rc != 0 and "held by another process" in err and "Traceback" not in err, err
    finally:
        holder.kill()
        await holder.wait()


@pytest.mark.parametrize("view", ["plans", "commands", "residency"])
async def test_every_history_view_answers_from_the_controller(js_log: JetStreamLog, tmp_path: Path,
                                                              view: str) -> None:
    home = tmp_path / "home"
    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-views")
    await ctl.start()
    admin = await serve_admin(ctl, "127.0.0.1", 0)
    try:
        rc, out, err = await gridctl(home, "history", view, "--json")
        assert rc == 0, err
        assert isinstance(json.loads(out), list)
    finally:
        await admin.stop()
        await ctl.stop()


async def test_replay_while_the_controller_holds_the_store_still_answers(
        js_log: JetStreamLog, nats_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`gridctl replay` beside a running grid: the replay stands, only its record is skipped."""
    home = tmp_path / "home"
    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-replay")
    await ctl.start()
    try:
        await ctl.tick("test")
        rc, out, err = await gridctl(home, "replay", "--nats", nats_server.url, "--json")
        assert rc == 0, err
        assert "run not recorded" in err and "Traceback" not in err, err
        assert json.loads(out)
    finally:
        await ctl.stop()
