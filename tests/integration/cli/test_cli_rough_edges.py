"""The first steps a new user takes (issue 15's list), each as gridctl in a real process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from grid import __version__
from grid.controller.api import serve_admin
from grid.controller.service import Controller, ControllerSettings
from grid.events.base import new_event_id
from grid.events.host import ProtectionTransition
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.simhost import SimHost


def gridctl(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    env.pop("GRID_NATS_URL", None)
    env.pop("GRID_ADMIN_URL", None)
    return subprocess.run([sys.executable, "-m", "grid.cli.main", *args], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)


def test_version_flag(tmp_path: Path) -> None:
    res = gridctl(tmp_path, "--version")
    assert res.returncode == 0 and res.stdout.strip() == f"gridctl {__version__}"


def test_mode_help_states_both_defaults(tmp_path: Path) -> None:
    res = gridctl(tmp_path, "mode", "--help")
    text = " ".join(res.stdout.split())
    assert res.returncode == 0
    assert "recommend (a new grid's default)" in text and "`gridctl up` starts in automatic" in text, text


def test_http_url_for_nats_is_a_clear_error(tmp_path: Path) -> None:
    for args in (["up", "--nats", "http://127.0.0.1:4222", "--port", "0"],
                 ["events", "tail", "--nats", "http://127.0.0.1:4222"]):
        res = gridctl(tmp_path / "home", *args)
        assert res.returncode != 0, res
        assert "is not a NATS server URL" in res.stderr and "gaierror" not in res.stderr + res.stdout, res.stderr
        assert "Traceback" not in res.stderr


def test_up_on_an_unreachable_server_stops_quietly_and_leaves_no_nats_url(tmp_path: Path) -> None:
    home = tmp_path / "home"
    res = gridctl(home, "up", "--nats", "nats://127.0.0.1:1", "--port", "0", "--no-dashboard", timeout=120)
    assert res.returncode != 0
    assert "cannot connect to NATS" in res.stderr
    assert "grid stopped" not in res.stdout and "stopping" not in res.stdout, res.stdout
    assert not (home / "nats.url").exists()
    assert not (home / "up.pid").exists()


async def test_status_shows_the_throttled_reason_and_watches(js_log: JetStreamLog, tmp_path: Path) -> None:
    home = tmp_path / "home"
    host = SimHost("host-t")
    await host.heartbeat(js_log)
    await js_log.append(ProtectionTransition(event_id=new_event_id(), at=time.time(), host_id="host-t",
                                             from_state="accepting", to_state="throttled", reason="cpu_high"))
    await js_log.append(msgspec.structs.replace(host.heartbeat_event(), state="throttled"))  # as the agent reports it
    settings = ControllerSettings(tick_interval_seconds=0.5, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                                  lease_renew_seconds=0.5, restart_grace_seconds=0.0)
    ctl = Controller(js_log, home, settings=settings, controller_id="ctl-edges")
    await ctl.start()
    admin = await serve_admin(ctl, "127.0.0.1", 0)
    try:
        res = await asyncio.to_thread(gridctl, home, "status")
        assert res.returncode == 0, res.stderr
        assert "throttled: cpu_high" in res.stdout, res.stdout
        env = {**os.environ, "GRID_HOME": str(home)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "grid.cli.main", "status", "--watch", "0.3", "--json", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        # Interrupted once it has redrawn at least once (two documents), however long that took.
        assert proc.stdout is not None
        printed = [await asyncio.wait_for(proc.stdout.readline(), 30) for _ in range(2)]
        proc.send_signal(signal.SIGINT)
        rest, err = await asyncio.wait_for(proc.communicate(), 20)
        out = b"".join(printed) + rest
        docs = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
        assert len(docs) >= 2, (out, err)
        assert all(d["hosts"][0]["host_id"] == "host-t" for d in docs)
        assert proc.returncode == 0 and b"Traceback" not in err, err
    finally:
        await admin.stop()
        await ctl.stop()


async def test_forecast_window_sets_the_demand_bucket_through_the_admin_api(js_log: JetStreamLog,
                                                                            tmp_path: Path) -> None:
    home = tmp_path / "home"
    settings = ControllerSettings(tick_interval_seconds=0.5, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                                  lease_renew_seconds=0.5, restart_grace_seconds=0.0)
    ctl = Controller(js_log, home, settings=settings, controller_id="ctl-window")
    await ctl.start()
    admin = await serve_admin(ctl, "127.0.0.1", 0)
    try:
        refused = await asyncio.to_thread(gridctl, home, "forecast-window", "0.5")
        assert refused.returncode == 2 and "greater than or equal to 1" in refused.stderr, refused.stderr
        done = await asyncio.to_thread(gridctl, home, "forecast-window", "4", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["bucket_seconds"] == 4.0
        assert ctl.runner["demand"].bucket_seconds == 4.0
    finally:
        await admin.stop()
        await ctl.stop()
