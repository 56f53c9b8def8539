"""The dashboard in a real browser: it loads, goes live, shows a `gridctl model set` within seconds,
and charts the requests a real gateway served.

Real parts throughout: nats-server with JetStream, the controller and its admin API, the
dashboard following the log, Debian's Chromium driven by Playwright, and `gridctl` as a child
process; the charts test runs `gridctl up` (embedded NATS, controller with its DuckDB analytics
store, gateway, agent serving SmolLM2 with llama.cpp). Screenshots are saved under the test's
temporary directory (printed on failure).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from grid.controller.api import serve_admin
from grid.controller.service import Controller, ControllerSettings
from grid.dashboard.app import Dashboard, create_dashboard_app, require_token_off_loopback
from grid.serving import serve
from grid.transport.jetstream import JetStreamLog

from tests.debian_packages import require_debian_tool
from tests.integration.controller.simhost import SimHost

pytestmark = pytest.mark.e2e

SETTINGS = ControllerSettings(tick_interval_seconds=0.5, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0)
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _find_chromium() -> str | None:
    return os.environ.get("GRID_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def chromium_path() -> str:
    """Debian's Chromium (Playwright's own browser download cannot work without the internet)."""
    return require_debian_tool(_find_chromium, ("chromium",),
                               "the dashboard test needs Chromium: `apt-get install chromium` (or set GRID_CHROMIUM)")


async def gridctl(home: Path, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "GRID_HOME": str(home)}
    env.pop("GRID_ADMIN_URL", None)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "grid.cli.main", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_dashboard_shows_model_set_live(js_log: JetStreamLog, tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    home = tmp_path / "home"
    host = SimHost("laptop-1")
    await host.heartbeat(js_log)
    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-dash")
    await ctl.start()
    dash = Dashboard(js_log)
    await dash.start()
    server = await serve(create_dashboard_app(dash, token=None), "127.0.0.1", 0, name="dashboard-test")
    shots = tmp_path / "screenshots"
    shots.mkdir()
    admin = None
    try:
        admin = await serve_admin(ctl, "127.0.0.1", 0)
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page(viewport={"width": 1400, "height": 900})
                await page.goto(server.url + "/")
                await page.wait_for_selector("#conn.live", timeout=10_000)
                await page.wait_for_selector("#hosts >> text=laptop-1", timeout=10_000)
                # This dashboard runs beside no analytics store: the charts say so instead of drawing.
                await page.wait_for_selector("#charts [data-reason=no_history]", timeout=10_000)
                await page.screenshot(path=str(shots / "1-loaded.png"), full_page=True)

                rc, _out, err = await gridctl(home, "model", "set", "dash-model.gguf", "--memory-mb", "300",
                                              "--min-replicas", "1")
                assert rc == 0, err
                # The profile, then the controller's plan for it, arrive over SSE without a reload.
                await page.wait_for_selector("#models >> text=dash-model.gguf", timeout=5_000)
                await page.wait_for_selector("#plan >> text=dash-model.gguf", timeout=10_000)
                await page.screenshot(path=str(shots / "2-model-set.png"), full_page=True)
                assert await page.locator("#mode").text_content() in ("recommend", "observe", "automatic")
            finally:
                await browser.close()
    finally:
        print(f"dashboard screenshots in {shots}")
        if admin is not None:
            await admin.stop()
        await server.stop()
        await dash.stop()
        if admin is not None:
            await admin.stop()
        await ctl.stop()
    assert (shots / "2-model-set.png").stat().st_size > 10_000


async def test_dashboard_token_is_required_when_configured(js_log: JetStreamLog) -> None:
    dash = Dashboard(js_log)
    await dash.start()
    server = await serve(create_dashboard_app(dash, token="s3cret-token"), "127.0.0.1", 0, name="dashboard-auth")
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            assert (await client.get("/")).status_code == 401
            assert (await client.get("/api/view")).status_code == 401
            assert (await client.get("/?token=wrong")).status_code == 401
            assert (await client.get("/api/view", headers={"Authorization": "Bearer s3cret-token"})).status_code == 200
            first = await client.get("/?token=s3cret-token")
            assert first.status_code == 303 and "token" not in first.headers["location"]
            assert (await client.get("/")).status_code == 200  # the HttpOnly cookie now authorizes
            view = (await client.get("/api/view")).json()
            assert view["version"] == 1 and "hosts" in view
    finally:
        await server.stop()
        await dash.stop()
    with pytest.raises(ValueError, match="open to the network"):
        require_token_off_loopback("0.0.0.0", None)
    require_token_off_loopback("127.0.0.1", None)
    require_token_off_loopback("::1", None)


MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHATS = 3


async def _wait_for_line(proc: subprocess.Popen[bytes], log_path: Path, pattern: str, timeout: float) -> str:
    """The output of `gridctl up` once it holds `pattern` (fails if the process exits first)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        text = log_path.read_text()
        if re.search(pattern, text):
            return text
        assert proc.poll() is None, text
        await asyncio.sleep(0.5)
    pytest.fail(f"`gridctl up` printed no {pattern!r} within {timeout:.0f} s:\n{log_path.read_text()[-3000:]}")


async def test_dashboard_charts_real_traffic(tmp_path: Path, bundled_model_home: Path) -> None:
    """Chats through the real gateway of `gridctl up` become points on the page's charts."""
    from playwright.async_api import async_playwright

    home = tmp_path / "home"
    home.mkdir()
    (home / "artifacts").symlink_to(bundled_model_home / "artifacts")
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    env.pop("GRID_NATS_URL", None)
    env.pop("GRID_ADMIN_URL", None)
    log_path = tmp_path / "up.log"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with open(log_path, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "grid.cli.main", "up", "--port", "0"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        text = await _wait_for_line(proc, log_path, r"ready:", 240)
        gateway = re.search(r"gateway\s+(http://\S+)/v1", text).group(1)  # type: ignore[union-attr]
        dashboard = re.search(r"dashboard\s+(http://\S+?)/?\s", text).group(1)  # type: ignore[union-attr]
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page(viewport={"width": 1400, "height": 1000})
                await page.goto(dashboard + "/")
                await page.wait_for_selector("#conn.live", timeout=10_000)
                # No request yet: the request chart says so; the host's heartbeats already chart its memory.
                await page.wait_for_selector("#charts [data-chart=requests] [data-empty]", timeout=15_000)
                await page.screenshot(path=str(shots / "1-no-requests.png"), full_page=True)

                async with httpx.AsyncClient(base_url=gateway, timeout=120) as client:
                    for i in range(CHATS):
                        resp = await client.post("/v1/chat/completions", json={
                            "model": MODEL, "max_tokens": 8,
                            "messages": [{"role": "user", "content": f"Count to {i + 2}."}]})
                        assert resp.status_code == 200, resp.text

                # The page polls its charts: the served model appears with points, until every chat
                # (flushed by the gateway's telemetry, then by the analytics sink) is counted.
                model = f'g.series[data-series="{MODEL}"]'
                await page.wait_for_selector(f"svg[data-chart=requests] {model} circle", timeout=30_000)
                await page.wait_for_function(
                    """([selector, n]) => [...document.querySelectorAll(selector)]
                         .reduce((sum, c) => sum + Number(c.dataset.v), 0) >= n""",
                    arg=[f"svg[data-chart=requests] {model} circle", CHATS], timeout=30_000)
                await page.screenshot(path=str(shots / "2-charts.png"), full_page=True)
                drawn = await page.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
                    '#charts svg[data-chart] g.series')].map(g => [
                      g.closest('svg').dataset.chart + '|' + g.dataset.series + '|' + g.dataset.measure,
                      [...g.querySelectorAll('circle')].map(c => Number(c.dataset.v))]))""")
            finally:
                await browser.close()
        requests = drawn[f"requests|{MODEL}|"]
        assert sum(requests) == CHATS and all(v >= 0 for v in requests), drawn
        assert drawn[f"errors|{MODEL}|"] and set(drawn[f"errors|{MODEL}|"]) == {0.0}, drawn
        p50, p95 = drawn[f"latency|{MODEL}|p50"], drawn[f"latency|{MODEL}|p95"]
        assert p50 and all(0 < a <= b for a, b in zip(p50, p95)), drawn
        assert drawn[f"demand|{MODEL}|observed"], drawn
        memory = [v for key, values in drawn.items() if key.startswith("memory|") for v in values]
        assert memory and max(memory) > 0, drawn  # SmolLM2's engine holds memory on the one host

        # The same numbers as JSON, bounded by the window's buckets.
        charts = httpx.get(f"{dashboard}/api/charts", params={"window": 3600}, timeout=10).json()
        assert charts["reason"] == "" and charts["bucket_seconds"] == 60.0
        by_id = {c["id"]: c for c in charts["charts"]}
        (served,) = [s for s in by_id["requests"]["series"] if s["name"] == MODEL]
        assert sum(v for _t, v in served["points"]) == CHATS and len(served["points"]) <= 60
        assert httpx.get(f"{dashboard}/api/charts", params={"window": "nan"}, timeout=10).status_code == 422
        print(json.dumps({k: len(v) for k, v in drawn.items()}))
    finally:
        print(f"dashboard screenshots in {shots}")
        if proc.poll() is None:
            await gridctl(home, "down")  # drains and unloads the engine like an operator would
            try:
                await asyncio.to_thread(proc.wait, 60)
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait(60)
