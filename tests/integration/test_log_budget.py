"""The log budget (issue 25 item 5a): the streams' reserved bytes follow `--log-budget` /
GRID_LOG_BUDGET or the free disk, and a budget that cannot fit is refused before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from grid.events.subjects import ALL_STREAMS, COMMANDS_STREAM, COMMANDS_VIEW_STREAM
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import (
    DEFAULT_LOG_BUDGET,
    MIB,
    MIN_LOG_BUDGET,
    STREAM_POLICIES,
    JetStreamLog,
    stream_byte_limits,
)
from grid.transport.log_budget import LogBudgetError, parse_size, resolve_log_budget

GIB = 1 << 30


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    nats = EmbeddedNats(tmp_path / "nats").start()
    try:
        yield nats
    finally:
        nats.stop()


async def _max_bytes(log: JetStreamLog) -> dict[str, int]:
    js = log.client.jetstream()
    return {name: int((await js.stream_info(name)).config.max_bytes or 0)
            for name in (*ALL_STREAMS, COMMANDS_VIEW_STREAM)}


async def test_a_small_budget_makes_every_stream_proportionally_smaller(server: EmbeddedNats) -> None:
    budget = parse_size("512MiB")
    log = await JetStreamLog.connect(server.url, log_budget=budget)
    try:
        sizes = await _max_bytes(log)
    finally:
        await log.close()
    assert sum(sizes.values()) <= budget
    assert sum(sizes.values()) > budget - len(sizes)  # the whole budget, split (rounded down)
    for name in ALL_STREAMS:
        share = STREAM_POLICIES[name].max_bytes / DEFAULT_LOG_BUDGET
        assert sizes[name] == int(budget * share), name
    assert sizes[COMMANDS_VIEW_STREAM] == sizes[COMMANDS_STREAM]

    # A later connection that knows no budget (a CLI, a restarted controller) leaves them so.
    other = await JetStreamLog.connect(server.url)
    try:
        assert await _max_bytes(other) == sizes
    finally:
        await other.close()
    # A new budget resizes them.
    bigger = await JetStreamLog.connect(server.url, log_budget=GIB)
    try:
        assert await _max_bytes(bigger) == stream_byte_limits(GIB)
    finally:
        await bigger.close()


def test_the_default_budget_follows_the_free_disk(tmp_path: Path) -> None:
    assert resolve_log_budget(None, tmp_path, free=100 * GIB) == DEFAULT_LOG_BUDGET
    assert resolve_log_budget(None, tmp_path, free=8 * GIB) == 2 * GIB
    assert resolve_log_budget(None, tmp_path, free=400 * MIB) == MIN_LOG_BUDGET  # the minimum still fits
    with pytest.raises(LogBudgetError, match=r"100\.0 MiB free.*256 MiB.*--log-budget"):
        resolve_log_budget(None, tmp_path, free=100 * MIB)
    with pytest.raises(LogBudgetError, match="minimum of 256 MiB"):
        resolve_log_budget("100MiB", tmp_path, free=100 * GIB)
    with pytest.raises(LogBudgetError, match="512MiB"):
        parse_size("512 furlongs")


def test_gridctl_up_refuses_a_budget_the_disk_cannot_hold_and_starts_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "GRID_HOME": str(home), "GRID_LOG_BUDGET": "1000000TiB"}
    env.pop("GRID_NATS_URL", None)
    out = subprocess.run([sys.executable, "-m", "grid.cli.main", "up", "--no-wait", "--port", "0",
                          "--no-dashboard"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    message = " ".join(out.stderr.split())
    assert "does not fit" in message and "free under" in message, out.stderr
    assert "--log-budget" in message and "256 MiB" in message, out.stderr
    # Nothing started: no NATS store, no URL or pid file for other commands to find.
    assert not (home / "nats").exists()
    assert not (home / "nats.url").exists() and not (home / "up.pid").exists()
