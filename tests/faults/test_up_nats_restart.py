"""`gridctl up` restarts its embedded nats-server when it dies, and says so (real processes).

kill -9 the embedded server under a running `gridctl up` (real agent, llama-server, gateway):
up notices, starts it again on the same port with the same store, and the gateway answers a
chat again within seconds.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grid.agent.engines.runtime import Runtime

pytestmark = [pytest.mark.engine, pytest.mark.slow]

GRIDCTL = [sys.executable, "-m", "grid.cli.main"]
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


class Up:
    def __init__(self, home: Path, env: dict[str, str], proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.home, self.env, self.proc, self.log_path = home, env, proc, log_path

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, needle: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text()
            if needle in text:
                return text
            assert self.proc.poll() is None, f"gridctl up exited:\n{text[-3000:]}"
            time.sleep(0.2)
        raise AssertionError(f"{needle!r} not printed within {timeout}s:\n{self.text()[-3000:]}")


def start_up(tmp_path: Path, bundled_model_home: Path, *args: str) -> Up:
    home = tmp_path / "home"
    home.mkdir()
    (home / "artifacts").symlink_to(bundled_model_home / "artifacts")
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    env.pop("GRID_NATS_URL", None)
    log_path = tmp_path / "up.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*GRIDCTL, "up", "--port", "0", *args], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return Up(home, env, proc, log_path)


def stop_up(up: Up) -> None:
    """`gridctl down`, as a user stops it; killed if it has not exited (or down failed)."""
    try:
        if up.proc.poll() is None:
            down = subprocess.run([*GRIDCTL, "down"], env=up.env, capture_output=True, text=True, timeout=120)
            assert down.returncode == 0, down.stderr
            up.proc.wait(60)
    finally:
        if up.proc.poll() is None:
            up.proc.kill()
            up.proc.wait(30)


@pytest.fixture
def running_up(tmp_path: Path, bundled_model_home: Path, engine_runtime: Runtime) -> Iterator[Up]:
    up = start_up(tmp_path, bundled_model_home)
    try:
        up.wait_for("ready:", 180)
        yield up
    finally:
        stop_up(up)


def chat_ok(gateway: str) -> bool:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
    try:
        return httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=30).status_code == 200
    except httpx.HTTPError:
        return False


def test_up_restarts_its_embedded_nats_after_kill_9(running_up: Up) -> None:
    text = running_up.text()
    gateway = re.search(r"gateway\s+(http://\S+)/v1", text).group(1)  # type: ignore[union-attr]
    nats_url = re.search(r"NATS JetStream\s+(nats://\S+)\s+\(embedded\)", text).group(1)  # type: ignore[union-attr]
    assert chat_ok(gateway)
    pid_file = running_up.home / "nats" / "nats-server.pid"
    old_pid = int(pid_file.read_text())

    os.kill(old_pid, signal.SIGKILL)
    killed = time.monotonic()
    after = running_up.wait_for("embedded NATS server restarted", 30)
    assert "killed by SIGKILL" in after
    new_pid = int(pid_file.read_text())
    assert new_pid != old_pid
    assert (running_up.home / "nats.url").read_text().strip() == nats_url  # same port: clients find it

    deadline = killed + 30
    while not chat_ok(gateway):
        assert time.monotonic() < deadline, "the gateway did not serve again after the restart"
        time.sleep(0.5)
