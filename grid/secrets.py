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

Everything else under the grid home is owner-only too (directories 0700, files 0600): the
helpers below create directories and open files that way, and tighten what an older Grid (or a
wide umask) left open, warning with the old mode. They never change the process umask, which
belongs to the program embedding Grid; a child process Grid starts gets `CHILD_UMASK` instead.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import structlog

log = structlog.get_logger(__name__)

ENGINE_SECRET_FILE = "engine.secret"
OPERATOR_TOKEN_FILE = "operator.token"
READER_TOKEN_FILE = "reader.token"


class SecretFileError(RuntimeError):
    """A secret file exists but cannot be used; the message names the file and the fix."""


class PrivateModeError(SecretFileError):
    """A directory or file under the grid home is open to other users and cannot be made
    owner-only (not ours, a read-only filesystem); the message names it and the fix."""


# The umask of the children Grid starts inside the grid home (nats-server, engines): what they
# create themselves is owner-only whatever their own defaults (Grid opens their logs for them).
CHILD_UMASK = 0o077

# Files whose content is a credential. A sweep leaves them as they are: one others could read
# may have leaked already, so its reader refuses it and names the fix (read_secret and the
# identity loaders) instead of Grid quietly tightening it and carrying on.
SECRET_SUFFIXES = (".token", ".secret", ".key", ".nk", ".creds")

_OPEN_FLAGS = {
    "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "a+b": os.O_RDWR | os.O_CREAT | os.O_APPEND,
}


def _refuse(path: Path, mode: int, is_dir: bool, exc: OSError) -> PrivateModeError:
    fix = f"chmod {'700' if is_dir else '600'} {path}"
    return PrivateModeError(
        f"{path} is open to other users (mode {mode:o}) and cannot be made owner-only "
        f"({exc.strerror or exc}); run `{fix}` as its owner, or choose another GRID_HOME"
    )


def _tighten(path: Path, st_mode: int, chmod: Callable[[int], None], *, warn: bool = True) -> bool:
    """Drop the group/other bits of `st_mode` through `chmod`, warning with the old mode; True
    when something changed. PrivateModeError when the change is refused."""
    mode = stat.S_IMODE(st_mode)
    if not mode & 0o077:
        return False
    new = mode & 0o700
    try:
        chmod(new)
    except FileNotFoundError:
        return False  # removed meanwhile (a running server replaces its files)
    except OSError as exc:  # EPERM (not ours), EROFS: the path stays open to others
        raise _refuse(path, mode, stat.S_ISDIR(st_mode), exc) from exc
    if warn:
        log.warning("made owner-only", path=str(path), old_mode=f"{mode:o}", new_mode=f"{new:o}")
    return True


def tighten_owner_only(path: Path, *, warn: bool = True) -> bool:
    """Make an existing file 0600-like (directory 0700-like) when others have any access to it,
    warning with its old mode (`warn=False`: a file Grid has just had made, such as DuckDB's WAL);
    False when it was owner-only already or does not exist. PrivateModeError when it cannot be
    changed. A symbolic link is left alone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        return False
    return _tighten(Path(path), st.st_mode, lambda m: os.chmod(path, m), warn=warn)


def ensure_private_dir(path: Path) -> Path:
    """`path` as an owner-only directory: created 0700 (missing parents too), or tightened to
    0700 with a warning when it exists wider. PrivateModeError when it cannot be tightened."""
    path = Path(path)
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)  # the umask may only narrow it
        except FileExistsError:
            pass  # made by another process meanwhile: tightened below when it is the target
    st = os.stat(path)  # the home itself may be a symbolic link to the real directory
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} is not a directory")
    _tighten(path, st.st_mode, lambda m: os.chmod(path, m))
    return path


def tighten_tree(root: Path) -> int:
    """Tighten `root` and everything below it to owner-only (see tighten_owner_only), except
    credential files (SECRET_SUFFIXES), which their readers refuse instead. Symbolic links are
    neither followed nor changed. Returns how many entries were tightened."""
    root = Path(root)
    changed = 0
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return 0
    if _tighten(root, st.st_mode, lambda m: os.chmod(root, m)):
        changed += 1
    if not stat.S_ISDIR(st.st_mode):
        return changed
    for dirpath, dirnames, filenames in os.walk(root):  # never follows links to directories
        base = Path(dirpath)
        for name in dirnames:
            if tighten_owner_only(base / name):
                changed += 1
        for name in filenames:
            if name.endswith(SECRET_SUFFIXES):
                continue
            if tighten_owner_only(base / name):
                changed += 1
    return changed


def open_owner_only(path: Path, mode: str = "ab") -> BinaryIO:
    """Open `path` in binary `mode` ("ab", "wb" or "a+b"), creating it 0600; an existing file
    others can read is tightened first (with a warning). The parent must exist."""
    flags = _OPEN_FLAGS.get(mode)
    if flags is None:
        raise ValueError(f"open_owner_only supports modes {', '.join(_OPEN_FLAGS)}, not {mode!r}")
    fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
    try:
        _tighten(Path(path), os.fstat(fd).st_mode, lambda m: os.fchmod(fd, m))
        return os.fdopen(fd, mode)  # type: ignore[return-value]
    except BaseException:
        os.close(fd)
        raise


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
