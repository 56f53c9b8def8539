"""An unusable operator token: `gridctl up` and the admin commands name the file and the fix.

Empty, readable by others, or not text at all (binary, or control characters): each is refused
before anything starts, with a one-line error instead of a SecretFileError or
UnicodeDecodeError traceback, and nothing is left running or recorded in the grid home.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BAD_TOKENS = {
    "empty": (b"", 0o600, "is empty"),
    "world_readable": (b"0123456789abcdef\n", 0o644, "chmod 600"),
    "binary": (bytes(range(128, 256)) * 4, 0o600, "not hold a text token"),
    "control_characters": (b"abc\x00\x07def\n", 0o600, "not hold a text token"),
}


def gridctl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "300"}
    for name in ("GRID_NATS_URL", "GRID_ALLOCATOR_CONTROL_TOKEN", "GRID_ALLOCATOR_TOKEN_FILE"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "grid.cli.main", *args], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)


def bad_home(tmp_path: Path, kind: str) -> tuple[Path, Path, str]:
    data, mode, hint = BAD_TOKENS[kind]
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    token = home / "operator.token"
    token.write_bytes(data)
    token.chmod(mode)
    return home, token, hint


def assert_clear_error(result: subprocess.CompletedProcess[str], token: Path, hint: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    for raw in ("Traceback", "SecretFileError", "UnicodeDecodeError"):
        assert raw not in result.stderr, result.stderr
    flat = " ".join(result.stderr.split())  # rich wraps long lines
    assert str(token) in flat and hint in flat, result.stderr


@pytest.mark.parametrize("kind", sorted(BAD_TOKENS))
def test_up_refuses_an_unusable_operator_token_before_starting_anything(tmp_path: Path, kind: str) -> None:
    home, token, hint = bad_home(tmp_path, kind)
    result = gridctl(home, "up", "--port", "0", "--no-wait")
    assert_clear_error(result, token, hint)
    # Refused before NATS, the model download or the pid file.
    assert sorted(p.name for p in home.iterdir()) == ["operator.token"]


@pytest.mark.parametrize("kind", sorted(BAD_TOKENS))
def test_admin_commands_refuse_an_unusable_operator_token(tmp_path: Path, kind: str) -> None:
    home, token, hint = bad_home(tmp_path, kind)
    result = gridctl(home, "mode", "observe", "--admin", "http://127.0.0.1:9")
    assert_clear_error(result, token, hint)
