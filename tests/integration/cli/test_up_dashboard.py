"""`gridctl up | tee`: the URLs it prints (dashboard, /metrics) answer, and Ctrl-C at the terminal
(SIGINT to the whole foreground group, tee included) leaves no llama-server child behind.

Before, tee died first, the shutdown's next print hit the closed pipe, and the BrokenPipeError cut
the drain short: the engines outlived gridctl.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from grid.agent.engines.runtime import Runtime
from tests.engineproc import is_engine


def _wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _engines(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [p for p in root.children(recursive=True) if is_engine(p)]
    except psutil.Error:
        return []


def test_up_prints_dashboard_and_metrics_and_ctrl_c_through_tee_leaves_no_engine(
        tmp_path: Path, engine_runtime: Runtime) -> None:
    home = tmp_path / "home"
    out = tmp_path / "up.out"
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    env.pop("GRID_NATS_URL", None)
    cmd = f"{sys.executable} -m grid.cli.main up --port 0 2>{tmp_path / 'up.err'} | tee {out}"
    shell = subprocess.Popen(["bash", "-c", cmd], env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    root = psutil.Process(shell.pid)
    engines: list[psutil.Process] = []
    try:
        text = _wait_for(lambda: out.exists() and "Ctrl-C" in out.read_text() and out.read_text(), 240,
                         "gridctl up to be ready")
        assert "ready:" in text, text + (tmp_path / "up.err").read_text()
        dashboard = re.search(r"dashboard\s+(http://\S+)", text)
        metrics = re.search(r"metrics\s+(http://\S+/metrics)", text)
        assert dashboard and metrics, text
        assert dashboard.group(1).startswith("http://127.0.0.1:")  # loopback by default
        view = httpx.get(dashboard.group(1).rstrip("/") + "/api/view", timeout=10).json()
        assert view["hosts"] and view["models"], view
        page = httpx.get(dashboard.group(1), timeout=10)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        families = {f.name for f in text_string_to_metric_families(httpx.get(metrics.group(1), timeout=10).text)}
        assert {"grid_controller_plan_age_seconds", "grid_controller_lease_term"} <= families
        engines = _wait_for(lambda: _engines(root), 30, "the llama-server child")
        # Ctrl-C at a terminal: SIGINT to the foreground process group (bash, gridctl, tee).
        os.killpg(shell.pid, signal.SIGINT)
        shell.wait(120)
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()

    def gone(p: psutil.Process) -> bool:
        try:
            return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    survivors = [p.pid for p in engines if not gone(p)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"llama-server children outlived gridctl up: {survivors}"
    assert not (home / "up.pid").exists()
