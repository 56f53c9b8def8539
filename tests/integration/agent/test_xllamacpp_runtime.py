"""The prebuilt llama.cpp runtime (xllamacpp) serves the real GGUF behind llama-server's flags."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from grid.transport.embedded import free_port

pytestmark = pytest.mark.engine


def test_xllamacpp_child_serves_with_its_key_and_stops_on_sigterm(bundled_gguf: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "engine.key"
    key_file.write_text("engine-key-1\n")
    os.chmod(key_file, 0o600)
    port = free_port()
    argv = [sys.executable, "-m", "grid.agent.engines.xllamacpp_server", "--model", str(bundled_gguf),
            "--host", "127.0.0.1", "--port", str(port), "--api-key-file", str(key_file), "--slots",
            "--parallel", "1", "--ctx-size", "1024", "--alias", "smol", "--threads", "1", "--threads-batch", "1",
            "--threads-http", "2", "--no-webui"]
    log = open(tmp_path / "engine.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "engine.log").read_text()[-2000:]
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "engine did not become healthy"
            time.sleep(0.2)
        assert httpx.get(base + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        client = openai.OpenAI(base_url=base + "/v1", api_key="engine-key-1", timeout=120)
        reply = client.chat.completions.create(model="smol", max_tokens=4,
                                               messages=[{"role": "user", "content": "Say hello"}])
        assert reply.choices[0].message.content and reply.usage.completion_tokens >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=15) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()


def test_unknown_flag_and_empty_key_are_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.key"
    empty.write_text("")
    base = [sys.executable, "-m", "grid.agent.engines.xllamacpp_server", "--model", "m.gguf", "--port", "1"]
    bad = subprocess.run([*base, "--api-key-file", str(empty), "--flash-attn"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--flash-attn" in bad.stderr
    nokey = subprocess.run([*base, "--api-key-file", str(empty)], capture_output=True, text=True, timeout=60)
    assert nokey.returncode != 0 and "empty" in nokey.stderr
