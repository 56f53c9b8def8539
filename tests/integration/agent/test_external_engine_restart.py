"""A registered external engine that restarts is routable again within seconds of answering.

Real parts: a llama-server (the session's runtime, with the SmolLM2 GGUF) started outside Grid,
an agent in this process on the real nats-server, heartbeats read back from JetStream. The
engine is killed, stays dead long enough for several probes to fail (the old exponential backoff
had pushed the next probe 16 s out by then), and is restarted on the same port; the time from its
`/health` answering 200 again to the first heartbeat reporting it ready is what is measured.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grid.agent import external
from grid.agent.engines.runtime import Runtime
from grid.events.host import HostHeartbeat, Residency
from grid.transport.embedded import free_port
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import heartbeats, wait_for
from tests.integration.agent.conftest import AgentFactory

pytestmark = [pytest.mark.integration, pytest.mark.engine]

MODEL = "smol-restarting"
# Dead this long after the agent first reports it failed: just past the old backoff's probe at
# 1+2+4 s, whose next came 8 s after it, some 6 s after the restarted engine answers.
DEAD_SECONDS = 7.5
# From the engine answering /health to a heartbeat reporting it ready: one probe interval, the
# probe itself and the heartbeat it triggers, with room for a shared 2-core CPU.
ROUTABLE_WITHIN_SECONDS = 4.0


class ExternalLlamaServer:
    """A llama-server Grid did not start, on a fixed port so it can come back where it was."""

    def __init__(self, runtime: Runtime, gguf: Path, port: int, key_file: Path, log: Path) -> None:
        self.runtime, self.gguf, self.port, self.key_file, self.log = runtime, gguf, port, key_file, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*self.runtime.command, "--model", str(self.gguf), "--host", "127.0.0.1", "--port", str(self.port),
                 "--alias", MODEL, "--api-key-file", str(self.key_file), "--ctx-size", "512", "--threads", "1",
                 "--no-webui"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=1, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    async def wait_healthy(self, timeout: float = 120.0) -> float:
        """The wall-clock time /health first answered 200 (polled every 20 ms)."""
        deadline = time.monotonic() + timeout
        while not await asyncio.to_thread(self.healthy):
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-2000:]
            assert time.monotonic() < deadline, "the llama-server did not become healthy"
            await asyncio.sleep(0.02)
        return time.time()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)


@pytest.fixture
def engine(tmp_path: Path, bundled_gguf: Path, engine_runtime: Runtime) -> Iterator[ExternalLlamaServer]:
    key_file = tmp_path / "engine.key"
    key_file.write_text("sk-restart-test\n")
    key_file.chmod(0o600)
    server = ExternalLlamaServer(engine_runtime, bundled_gguf, free_port(), key_file, tmp_path / "engine.log")
    try:
        yield server
    finally:
        server.kill()


def _external(hb: HostHeartbeat) -> Residency | None:
    return next((r for r in hb.residencies if r.model_id == MODEL and not r.managed), None)


async def _first_report(log: JetStreamLog, state: str, after: float) -> HostHeartbeat | None:
    """The first heartbeat published after `after` (wall clock) that reports the engine `state`."""
    for hb in await heartbeats(log):
        seen = _external(hb)
        if hb.at >= after and seen is not None and seen.state == state:
            return hb
    return None


async def test_a_restarted_external_engine_is_routable_within_seconds_of_answering(
        js_log: JetStreamLog, start_agent: AgentFactory, engine: ExternalLlamaServer) -> None:
    engine.start()
    await engine.wait_healthy()
    agent = await start_agent()
    reg = external.validate(MODEL, engine.url, external.KIND_LLAMA_CPP, 0, engine.key_file)
    assert isinstance(reg, external.Registration)
    external.save(agent.paths.root, [reg])
    ready = await wait_for(lambda: _first_report(js_log, "ready", 0.0), timeout=30)
    assert _external(ready).endpoint == engine.url  # type: ignore[union-attr]

    killed_at = time.time()
    engine.kill()
    failed = await wait_for(lambda: _first_report(js_log, "failed", killed_at), timeout=30)
    # Several probes fail while it is down (the case that used to wait for a backed-off probe).
    await asyncio.sleep(DEAD_SECONDS - (time.time() - failed.at))

    engine.start()  # the same port: an operator's restart of the same engine
    answering_at = await engine.wait_healthy()
    back = await wait_for(lambda: _first_report(js_log, "ready", answering_at), timeout=60, interval=0.2)
    took = back.at - answering_at
    print(f"external engine routable again {took:.2f}s after answering /health "
          f"(down {answering_at - killed_at:.1f}s)")
    assert took <= ROUTABLE_WITHIN_SECONDS, f"routable only {took:.1f}s after the engine answered again"
    assert _external(back).endpoint == engine.url  # type: ignore[union-attr]
