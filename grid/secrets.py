"""Owner-only secrets under the grid home: the operator token, the reader token and the machine's
local secret.

The operator token may do everything the admin API offers; the reader token may only read (the
dashboard and its live stream, status, history, metrics), so it can be handed to someone who
should watch the grid but not change it.

Engine keys never leave their host and are never carried in events: each agent makes a random
key of its own (its state dir's `engine.key`, via `load_or_create_secret`), gives it to its
llama.cpp children and adds it itself when it forwards a request from NATS (grid.infer). No
secret is shared between machines: `engine.secret` stays on its machine, where it keys the
owner tokens of the children its agents spawn (grid.agent.ownership).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

ENGINE_SECRET_FILE = "engine.secret"
OPERATOR_TOKEN_FILE = "operator.token"
READER_TOKEN_FILE = "reader.token"


class SecretFileError(RuntimeError):
    """A secret file exists but cannot be used; the message names the file and the fix."""


def write_owner_only(path: Path, data: bytes) -> None:
    """Atomically create `path` with mode 0600 (temp file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def read_secret(path: Path) -> str:
    """The token in an existing secret file, or SecretFileError saying what is wrong and what to do.

    Refuses group/world-readable files, empty files and files that are not text: a token that
    others can read, or one that is silently wrong, is worse than a refusal to start.
    """
    try:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise SecretFileError(f"{path} is readable by others (mode {mode:o}); run `chmod 600 {path}`")
        value = path.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise SecretFileError(
            f"{path} does not hold a text token (binary data); delete it to have a new one generated"
        ) from exc
    except OSError as exc:
        raise SecretFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not value:
        raise SecretFileError(f"{path} is empty; delete it to have a new token generated")
    if not value.isprintable():
        raise SecretFileError(
            f"{path} does not hold a text token (control characters); delete it to have a new one generated"
        )
    return value


def load_or_create_secret(path: Path, nbytes: int = 32) -> str:
    """Read a token file (see read_secret), creating it (0600) on first use."""
    if path.exists():
        return read_secret(path)
    value = secrets.token_hex(nbytes)
    write_owner_only(path, (value + "\n").encode())
    return value


def engine_key(fleet_secret: str, host_id: str) -> str:
    """A key derived from a local secret, for benches and tests that spawn an engine themselves
    (Grid's serving path uses the agent's random key, never a derived one)."""
    return hmac.new(fleet_secret.encode(), f"engine-key:{host_id}".encode(), hashlib.sha256).hexdigest()


def tokens_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
