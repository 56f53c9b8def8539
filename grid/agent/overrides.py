"""Durable local operator overrides: one owner-only file the running agent polls.

`gridctl node drain|pause|quarantine` write it, `gridctl node resume` removes it. It survives
agent restarts; an optional wall-clock expiry releases it automatically.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import msgspec

from grid.agent.protection import OVERRIDE_STATES, Override
from grid.agent.state import atomic_write, quarantine_file

# CLI verb -> protection state
VERB_STATES: dict[str, str] = {"drain": "draining", "pause": "paused", "quarantine": "quarantined"}

_decoder = msgspec.json.Decoder(Override)
_encoder = msgspec.json.Encoder(order="deterministic")


class OverrideError(ValueError):
    pass


def make_override(verb_or_state: str, *, reason: str, now: float, for_seconds: float | None) -> Override:
    state = VERB_STATES.get(verb_or_state, verb_or_state)
    if state not in OVERRIDE_STATES:
        raise OverrideError(f"unknown override {verb_or_state!r}")
    if for_seconds is not None and not for_seconds > 0:
        raise OverrideError("--for-seconds must be positive")
    return Override(
        state=state,
        reason=reason,
        set_at=now,
        expires_at=None if for_seconds is None else now + for_seconds,
    )


def write_override(path: Path, override: Override) -> None:
    atomic_write(path, _encoder.encode(override))


def clear_override(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def read_override(path: Path) -> tuple[Override | None, str | None]:
    """The stored override (expired or not) and a warning if the file was unreadable.

    A corrupt override file fails closed: it is quarantined and read as a quarantine override,
    because an operator clearly meant to restrict this host.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, None
    try:
        override = _decoder.decode(data)
        if override.state not in OVERRIDE_STATES:
            raise msgspec.ValidationError(f"unknown override state {override.state!r}")
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        target = quarantine_file(path)
        fenced = Override(state="quarantined", reason=f"unreadable override file ({target.name})")
        write_override(path, fenced)
        return fenced, f"override_file_quarantined: {target.name} ({str(exc)[:120]})"
    return override, None


def active_override(override: Override | None, now: float) -> Override | None:
    """The override still in force at wall time `now` (pure)."""
    if override is None:
        return None
    if override.expires_at is not None and now >= override.expires_at:
        return None
    return override


class OverrideWatcher:
    """Re-reads the override file only when it changed (mtime), reporting problems through `warn`."""

    def __init__(self, path: Path, warn: Callable[[str], None]) -> None:
        self.path = path
        self.warn = warn
        self._override: Override | None = None
        self._mtime: int | None = None

    def current(self) -> Override | None:
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            self._override, self._mtime = None, None
            return None
        if mtime != self._mtime:
            override, warning = read_override(self.path)
            if warning:
                self.warn(warning)
            self._override = override
            with contextlib.suppress(FileNotFoundError):
                self._mtime = self.path.stat().st_mtime_ns
        return self._override
