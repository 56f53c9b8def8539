"""`gridctl test scenario` as a user runs it: separate processes, different hash seeds, same bytes."""

from __future__ import annotations

import os
import subprocess
import sys

ARGS = ["-m", "grid.cli.main", "test", "scenario", "--machines", "4", "--users", "20", "--hours", "0.75",
        "--seed", "11", "--oracle", "--json"]


def _run(hash_seed: str) -> bytes:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run([sys.executable, *ARGS], env=env, capture_output=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


def test_same_seed_same_bytes_across_processes_and_hash_seeds() -> None:
    a = _run("1")
    b = _run("2")
    assert a == b
    assert b'"oracle"' in a and b'"served_demand"' in a


def test_refusal_is_a_clear_message_and_exit_status() -> None:
    env = {**os.environ}
    done = subprocess.run([sys.executable, "-m", "grid.cli.main", "test", "scenario", "--machines", "8", "--oracle"],
                          env=env, capture_output=True, timeout=120, check=False)
    assert done.returncode == 2
    assert b"bounded to 4 machines" in done.stderr
