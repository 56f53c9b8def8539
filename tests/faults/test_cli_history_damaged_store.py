"""A damaged DuckDB analytics store: `gridctl history` says which file and what to do, no traceback.

DuckDB reads pages lazily, so a truncated file can open cleanly and fail only in the query. The
store is a real one (the sink's schema, rows inserted in DuckDB's own batches), truncated at
block boundaries until one size opens but breaks the command's query; the command must then
fail cleanly, and so must a file too short to open at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from grid.analytics import queries
from grid.analytics.sink import open_store
from replay import store as replay_store

HEADER_BYTES = 3 * 4096  # DuckDB's file header and two database headers
BLOCK_BYTES = 256 * 1024


def gridctl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    env.pop("GRID_NATS_URL", None)
    return subprocess.run([sys.executable, "-m", "grid.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def build_store(path: Path) -> None:
    con = open_store(path)
    con.execute(
        "INSERT INTO plans SELECT 'GRID_PLANS', i, i * 1.0, '1:' || i, 'v1', md5(i::VARCHAR), 1, "
        "'{\"placements\": [{\"model_id\": \"m' || (i % 5) || '\", \"host_id\": \"h' || (i % 7) || '\"}]}' "
        "FROM range(1, 20001) t(i)"
    )
    con.execute(
        "INSERT INTO residencies SELECT 'GRID_HOSTS', i, 0, i * 1.0, 'h' || (i % 7), 'm' || (i % 5), "
        "CASE WHEN i % 3 = 0 THEN 'ready' ELSE 'warming' END, 512, true, 0 FROM range(1, 40001) t(i)"
    )
    con.execute("CHECKPOINT")
    con.close()


def opens_but_query_fails(path: Path, query: Callable[[duckdb.DuckDBPyConnection], object]) -> bool:
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return False
    try:
        query(con)
    except duckdb.Error:
        return True
    finally:
        con.close()
    return False


def truncated_copy(src: Path, dst: Path, query: Callable[[duckdb.DuckDBPyConnection], object]) -> int:
    """Copy `src` to `dst` cut at the first block boundary where it opens but `query` fails."""
    size = src.stat().st_size
    for cut in range(HEADER_BYTES + BLOCK_BYTES // 2, size, BLOCK_BYTES // 2):
        shutil.copyfile(src, dst)
        os.truncate(dst, cut)
        if opens_but_query_fails(dst, query):
            return cut
    raise AssertionError(f"no truncation of {src} ({size} bytes) opens and then fails the query")


def assert_clear_error(result: subprocess.CompletedProcess[str], path: Path) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "IOException" not in result.stderr, result.stderr
    flat = " ".join(result.stderr.split())  # rich wraps long lines
    assert str(path) in flat, result.stderr
    assert "damaged" in flat and "Move it aside" in flat, result.stderr


@pytest.mark.parametrize(
    ("command", "query"),
    [
        ("plans", lambda con: (queries.plan_changes(con), replay_store.plan_placement_changes(con))),
        ("residency", lambda con: queries.residency_timeline(con)),
    ],
)
@pytest.mark.parametrize("json_out", [False, True])
def test_history_on_a_truncated_store_fails_with_the_file_and_the_fix(
    tmp_path: Path, command: str, query: Callable[[duckdb.DuckDBPyConnection], object], json_out: bool
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    whole = tmp_path / "whole.duckdb"
    build_store(whole)
    store = home / "analytics.duckdb"
    truncated_copy(whole, store, query)

    # The whole store, where the damage is (residency shows the last day by default).
    window = ["--from", "0"] if command == "residency" else []
    result = gridctl(home, "history", command, *window, *(["--json"] if json_out else []))
    assert_clear_error(result, store)
    assert result.stdout == ""


@pytest.mark.parametrize("command", ["plans", "residency"])
def test_history_on_a_store_too_short_to_open_fails_with_the_file_and_the_fix(tmp_path: Path, command: str) -> None:
    whole = tmp_path / "whole.duckdb"
    build_store(whole)
    store = tmp_path / "short.duckdb"
    shutil.copyfile(whole, store)
    os.truncate(store, 1000)

    result = gridctl(tmp_path, "history", command, "--db", str(store))
    assert_clear_error(result, store)
