"""A damaged DuckDB analytics store under a running controller heals itself, without a restart.

DuckDB keeps what it needs in memory and never rereads its file's header, so a store overwritten
while the controller runs goes unnoticed by DuckDB itself until the next open. The controller's
analytics service must find it, move the file (and its WAL) aside to
`analytics.duckdb.corrupt-<unix time>` (owner-only), warn in `gridctl status`, rebuild a fresh
store from the log and answer `gridctl history` again. Real nats-server, real DuckDB files, the
real `gridctl` in its own process.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import duckdb

from grid.analytics.service import QUARANTINE, REOPEN, damage
from grid.controller.api import serve_admin
from grid.controller.service import Controller, ControllerSettings
from grid.events.base import new_event_id
from grid.events.requests import RequestCompleted, RequestFeatures
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.test_cli_admin import gridctl

SETTINGS = ControllerSettings(tick_interval_seconds=0.5, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0, analytics=True)
HEAL_SECONDS = 20.0


def _request(model: str) -> RequestCompleted:
    now = time.time()
    return RequestCompleted(event_id=new_event_id(), at=now, features=RequestFeatures(
        endpoint="chat", requested_model=model, served_model=model, host_id="host-1", input_units=10,
        output_units=20, service_seconds=0.2, finished_at=now))


async def _demand(home: Path) -> dict[str, int]:
    rc, out, err = await gridctl(home, "history", "demand", "--bucket", "0", "--from", "0", "--json")
    assert rc == 0, err
    return {r["model"]: r["requests"] for r in json.loads(out)}


async def _status(home: Path) -> dict[str, Any]:
    rc, out, err = await gridctl(home, "status", "--json")
    assert rc == 0, err
    return json.loads(out)


def _quarantined(home: Path) -> list[Path]:
    return sorted(p for p in home.glob("analytics.duckdb.corrupt-*") if not p.name.endswith(".wal"))


def _overwrite_with_garbage(path: Path) -> None:
    """In place, as a bad restore or a failing disk would: same inode, every byte replaced."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())


async def _until(what: str, check: Any, timeout: float = HEAL_SECONDS) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not within {timeout:g}s"
        await asyncio.sleep(0.3)


async def test_store_overwritten_while_the_controller_runs_is_quarantined_and_rebuilt(
        js_log: JetStreamLog, tmp_path: Path) -> None:
    home = tmp_path / "home"
    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-damaged-live")
    await ctl.start()
    admin = await serve_admin(ctl, "127.0.0.1", 0)
    store = home / "analytics.duckdb"
    try:
        assert ctl.analytics is not None
        for _ in range(3):
            await js_log.append(_request("m-a"))
        await js_log.append(_request("m-b"))
        assert await _demand(home) == {"m-a": 3, "m-b": 1}

        _overwrite_with_garbage(store)
        damaged_at = time.time()

        async def quarantined() -> list[Path]:
            return _quarantined(home)

        moved = await _until("the damaged store quarantined", quarantined)
        assert len(moved) == 1, moved
        stamp = int(moved[0].name.rsplit("-", 1)[1])
        assert damaged_at - 2 <= stamp <= time.time() + 1
        assert stat.S_IMODE(moved[0].stat().st_mode) == 0o600
        with open(moved[0], "rb") as f:  # what was moved aside is the damaged file itself
            assert f.read(12)[8:] != b"DUCK"

        # Status warns (analytics section), naming the quarantined file.
        async def warned() -> dict[str, Any] | None:
            doc = await _status(home)
            analytics = doc.get("analytics") or {}
            return doc if any(str(moved[0]) in w for w in analytics.get("warnings", ())) else None

        doc = await _until("the quarantine warning in status", warned)
        assert "quarantined" in " ".join(doc["analytics"]["warnings"])
        rc, out, err = await gridctl(home, "status")
        assert rc == 0, err
        assert "quarantined" in " ".join(err.split()), out + err

        # The fresh store is rebuilt from the log and history answers again, no restart.
        async def rebuilt() -> bool:
            return await _demand(home) == {"m-a": 3, "m-b": 1}

        await _until("history rebuilt from the log", rebuilt)
        # And the sink keeps following the log into the new store.
        await js_log.append(_request("m-b"))

        async def following() -> bool:
            return await _demand(home) == {"m-a": 3, "m-b": 2}

        await _until("new requests in the rebuilt store", following)
        assert _quarantined(home) == moved  # healed once, not over and over
    finally:
        await admin.stop()
        await ctl.stop()
    # The rebuilt file is a valid store on its own.
    con = duckdb.connect(str(store), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM request_features").fetchone() == (5,)
    finally:
        con.close()


async def test_store_damaged_before_start_is_quarantined_and_history_is_on(
        js_log: JetStreamLog, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    for _ in range(2):
        await js_log.append(_request("m-a"))
    (home / "analytics.duckdb").write_bytes(b"not a duckdb file " * 1000)
    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-damaged-start")
    await ctl.start()
    admin = await serve_admin(ctl, "127.0.0.1", 0)
    try:
        assert ctl.analytics is not None, ctl.warnings  # history is on, not off until a restart
        assert len(_quarantined(home)) == 1

        async def rebuilt() -> bool:
            return await _demand(home) == {"m-a": 2}

        await _until("history rebuilt from the log", rebuilt)
        warnings = (await _status(home))["analytics"]["warnings"]
        assert any("quarantined" in w for w in warnings), warnings
    finally:
        await admin.stop()
        await ctl.stop()


async def test_store_moved_aside_while_the_controller_runs_is_rebuilt(
        js_log: JetStreamLog, tmp_path: Path) -> None:
    """The documented rebuild starts by moving the file aside: the controller rebuilds it itself."""
    home = tmp_path / "home"
    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-moved")
    await ctl.start()
    admin = await serve_admin(ctl, "127.0.0.1", 0)
    store = home / "analytics.duckdb"
    try:
        await js_log.append(_request("m-a"))
        assert await _demand(home) == {"m-a": 1}
        os.replace(store, home / "aside.duckdb")

        async def rebuilt() -> bool:
            return store.exists() and await _demand(home) == {"m-a": 1}

        await _until("history rebuilt after the store was moved aside", rebuilt)
        assert _quarantined(home) == []  # nothing damaged: nothing quarantined
    finally:
        await admin.stop()
        await ctl.stop()


def test_damage_tells_corruption_from_transient_errors() -> None:
    assert damage(duckdb.IOException('IO Error: The file "x" exists, but it is not a valid DuckDB database file!')) \
        == QUARANTINE
    assert damage(duckdb.IOException("IO Error: Corrupt database file: computed checksum 1 does not match")) \
        == QUARANTINE
    assert damage(duckdb.SerializationException("Serialization Error: field id mismatch")) == QUARANTINE
    assert damage(duckdb.InternalException("INTERNAL Error: block not found")) == QUARANTINE
    assert damage(duckdb.IOException("IO Error: Could not write file \"x.wal\": No space left on device")) is None
    assert damage(duckdb.IOException('IO Error: Could not set lock on file "x": Conflicting lock is held')) is None
    assert damage(duckdb.IOException("IO Error: Permission denied")) is None
    assert damage(duckdb.FatalException("FATAL Error: database has been invalidated because of a previous "
                                        "fatal error")) == REOPEN
    assert damage(duckdb.ConnectionException("Connection Error: Connection already closed!")) is None
    assert damage(OSError("no")) is None
