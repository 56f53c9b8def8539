"""`gridctl status` piped (no terminal, so no width): every value is printed whole, on one line."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

LONG_HOST = "host-" + "rack-b-shelf-4-slot-12-" * 4 + "end"
LONG_MODEL = "org-" + "very-long-model-name-" * 5 + "Q4_K_M.gguf"

STATUS = {
    "controller": {"id": "ctl-1", "lease": {"state": "held", "term": 3}},
    "mode": {"requested": "automatic", "effective": "automatic", "log_durable": True},
    "revisions": {"dirty": 0, "processed": 1, "success": 1},
    "last_tick": {"duration_ms": 1.5, "reason": "timer"},
    "plan": {"generation": 2},
    "hosts": [{
        "host_id": LONG_HOST, "state": "accepting", "fresh": True, "heartbeat_age_seconds": 1.0,
        "capacity_mb": 16000, "used_mb": 4000, "free_mb": 12000, "failure_domain": "rack-b",
        "residencies": [{"model_id": LONG_MODEL, "state": "ready", "managed": True}],
    }],
    "models": [{"model_id": LONG_MODEL, "retired": False, "wanted": 1, "placed": 1, "ready": 1,
                "evidence": "demand", "shortfall": None}],
    "pending_commands": [],
    "withdrawn_commands": [],
}


@pytest.fixture
def admin_api() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps(STATUS).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_piped_status_prints_whole_ids_on_one_line(admin_api: str, tmp_path: object) -> None:
    env = {**os.environ, "GRID_HOME": str(tmp_path)}
    for name in ("COLUMNS", "LINES", "GRID_ALLOCATOR_CONTROL_TOKEN", "GRID_ADMIN_URL"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-m", "grid.cli.main", "status", "--admin", admin_api],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    host_rows = [line for line in lines if LONG_HOST in line]
    assert host_rows, out.stdout
    assert LONG_MODEL in host_rows[0]  # the residency column, whole, on the host's own row
    assert any(LONG_MODEL in line and LONG_HOST not in line for line in lines), out.stdout  # Models table
    assert "…" not in out.stdout
