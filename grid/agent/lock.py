"""One agent per state directory: an advisory lock held for the agent's whole life.

The lock (flock on <state dir>/agent.lock) is held by whichever process runs the agent, a
foreground `gridctl node start` or the in-process agent of `gridctl up`, and the kernel drops
it when that process dies, so a crash never leaves a stale lock. The file's content names the
holder (pid, birth time, command line) for `gridctl node status`; it is informative only, the
lock itself is the truth.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

import msgspec
import psutil

LOCK_FILE = "agent.lock"


class AgentLockedError(RuntimeError):
    pass


class LockHolder(msgspec.Struct, kw_only=True):
    pid: int
    create_time: float
    cmdline: tuple[str, ...]
    host_id: str = ""


_holder_decoder = msgspec.json.Decoder(LockHolder)


def lock_path(state_dir: Path) -> Path:
    return Path(state_dir) / LOCK_FILE


class StateDirLock:
    def __init__(self, state_dir: Path) -> None:
        self.path = lock_path(state_dir)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait_seconds: float = 2.0) -> None:
        """Take the lock or raise AgentLockedError. Waits briefly: `node status` probes the lock
        with a momentary shared lock, which must not make a starting agent fail."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = read_holder(self.path.parent)
                    os.close(fd)
                    who = f" (pid {holder.pid})" if holder is not None else ""
                    raise AgentLockedError(
                        f"another agent is running for {self.path.parent}{who}; one agent per state directory"
                    ) from None
                time.sleep(0.05)
        self._fd = fd
        self.describe("")

    def describe(self, host_id: str) -> None:
        """Record who holds the lock (in place: the lock belongs to this inode)."""
        if self._fd is None:
            return
        me = psutil.Process()
        data = msgspec.json.encode(
            LockHolder(pid=me.pid, create_time=me.create_time(), cmdline=tuple(me.cmdline()), host_id=host_id)
        )
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def is_locked(state_dir: Path) -> bool:
    """Whether a live agent holds this state directory's lock (momentary shared-lock probe)."""
    return held(lock_path(state_dir))


def held(path: Path) -> bool:
    """Whether a live process holds an exclusive flock on `path` (momentary shared-lock probe)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's shared lock, if it got one
    return False


def read_holder(state_dir: Path) -> LockHolder | None:
    try:
        return _holder_decoder.decode(lock_path(state_dir).read_bytes())
    except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
        return None
