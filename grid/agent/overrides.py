"""Operator overrides: a durable local file, and the operator's `HostOverride` on the log.

`gridctl node drain|pause|quarantine` write the owner-only file the running agent polls, `gridctl
node resume` removes it. It survives agent restarts; an optional wall-clock expiry releases it
automatically.

`gridctl host drain|pause|quarantine|resume HOST` (from any machine with the operator credential)
appends a signed `HostOverride` on `grid.ctl.override.<host>`; the agent reads the last one with a
stream message get (`LogOverrides`) and honours it only if an operator or controller provably
wrote it for this host. The stricter of the two overrides applies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import msgspec

from grid.agent.protection import OVERRIDE_STATES, SEVERITY, Override
from grid.events import codec
from grid.events.control import HostOverride
from grid.events.log import StoredMessage
from grid.events.subjects import override_subject
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


# Roles whose HostOverride an agent honours (the permission table lets only them publish grid.ctl.>).
OVERRIDE_AUTHORS = ("operator", "controller")


def stricter(a: Override | None, b: Override | None) -> Override | None:
    """The more restrictive of two active overrides (pure)."""
    if a is None or b is None:
        return a if b is None else b
    return a if SEVERITY.get(a.state, 0) >= SEVERITY.get(b.state, 0) else b


class LogOverrides:
    """This host's operator override from the log: the last `HostOverride` on its subject.

    A message that no operator or controller provably wrote for this host (a forgery, a reflected
    copy, an undecodable body) is ignored: the override last proven stays in force, so a forger can
    neither impose nor lift one. Read failures keep it too.
    """

    def __init__(self, log: object, host_id: str, warn: Callable[[str], None]) -> None:
        self.log = log
        self.host_id = host_id
        self.warn = warn
        self.subject = override_subject(host_id)
        self._override: Override | None = None
        self._seq = 0
        self.ignored: dict[str, int] = {}

    @property
    def current(self) -> Override | None:
        return self._override

    async def refresh(self) -> Override | None:
        last_message = getattr(self.log, "last_message", None)
        if last_message is None:
            return self._override
        msg = await last_message(self.subject)
        if msg is not None and msg.seq != self._seq:
            self._seq = msg.seq
            self._take(msg)
        return self._override

    def _ignore(self, msg: StoredMessage, reason: str) -> None:
        self.ignored[reason] = self.ignored.get(reason, 0) + 1
        self.warn(f"override_ignored: seq {msg.seq} ({reason})")

    def _take(self, msg: StoredMessage) -> None:
        authorship = getattr(self.log, "authorship", None)
        if authorship is not None:
            verdict = authorship.verify(msg.subject, msg.data, msg.headers, at=msg.time)
            if not verdict.ok:
                self._ignore(msg, verdict.reason)
                return
            if verdict.role not in OVERRIDE_AUTHORS:
                self._ignore(msg, f"signed by a {verdict.role}")
                return
        try:
            event = codec.decode(msg.data)
        except codec.EventDecodeError as exc:
            self._ignore(msg, f"undecodable: {exc.reason}")
            return
        if not isinstance(event, HostOverride) or event.host_id != self.host_id:
            self._ignore(msg, "not an override for this host")
            return
        if event.state is None or event.state not in OVERRIDE_STATES:
            self._override = None
            return
        self._override = Override(state=event.state, reason=event.reason, set_at=event.at,
                                  expires_at=event.expires_at)
