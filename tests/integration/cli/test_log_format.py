"""`--log-format` reaches grid.logs.configure_logging: a served controller logs JSON lines or
console lines on stderr, as asked, against the session's real nats-server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def serve_controller_until_started(home: Path, nats_url: str, log_format: str) -> str:
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "300"}
    env.pop("GRID_NATS_URL", None)
    log_path = home / "stderr.log"
    with open(log_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grid.cli.main", "serve", "controller", "--nats", nats_url, "--port", "0",
             "--log-format", log_format],
            env=env, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if "controller started" in log_path.read_text():
                break
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    text = log_path.read_text()
    assert code == 0, text
    return next(line for line in text.splitlines() if "controller started" in line)


@pytest.mark.parametrize("log_format", ["json", "console"])
async def test_serve_controller_logs_in_the_format_asked(js_log, nats_server, tmp_path: Path, log_format: str) -> None:
    line = serve_controller_until_started(tmp_path, nats_server.url, log_format)
    if log_format == "json":
        record = json.loads(line)
        assert record["event"] == "controller started" and record["level"] == "info" and "timestamp" in record
    else:
        with pytest.raises(json.JSONDecodeError):
            json.loads(line)
        assert "[info" in line and "controller started" in line


def test_a_read_command_logs_warnings_to_stderr_never_into_its_json(tmp_path: Path) -> None:
    """A warning during a read command (here one logged by the command itself) lands on stderr:
    stdout carries only the command's output, so `--json` stays parseable."""
    probe = (
        "import json, structlog, typer\n"
        "from grid.cli.main import app\n"
        "@app.command('probe')\n"
        "def probe() -> None:\n"
        "    structlog.get_logger('probe').warning('probe warning')\n"
        "    typer.echo(json.dumps({'ok': True}))\n"
        "app(['probe'])\n"
    )
    env = {**os.environ, "GRID_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"ok": True}
    assert "probe warning" in proc.stderr
