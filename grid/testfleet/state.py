"""The fixture's state file: what runs (pid proofs, addresses) and which network objects exist.

Written after every step of a start, so a start that dies half way still leaves what `stop`
needs to remove exactly what it made. A damaged file is an error that names it, never a guess.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

STATE_FILE = "fleet.json"
SCHEMA_VERSION = 1


class FleetError(RuntimeError):
    """An expected refusal (bad settings, a fleet already running differently, a component that
    did not come up); the message says what and what to do."""


class FleetStateError(RuntimeError):
    """The state file is unreadable; the message names it and what to do."""


class ProcessRecord(msgspec.Struct, kw_only=True):
    """Enough to prove a pid is still the process we started (pid reuse is never signalled)."""

    pid: int
    create_time: float
    cmdline: tuple[str, ...]
    log: str
    # grid.procstart.start_stamp: the start time wall-clock corrections do not move (Linux).
    start_stamp: str | None = None


class HostManifest(msgspec.Struct, kw_only=True):
    host_id: str
    failure_domain: str
    capacity_mb: int
    port_range: tuple[int, int]
    home: str  # the logical host's own grid home (artifacts, engine key, agent state)
    netns: str | None = None
    address: str | None = None  # its address on the bridge (with netns)
    veth: str | None = None  # the bridge-side end of its veth pair
    agent: ProcessRecord | None = None


class FleetSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What `start` was asked for: a second start with the same settings is a no-op."""

    machines: int
    model_id: str
    artifact_sha256: str
    model_memory_mb: int
    capacities_mb: tuple[int, ...]
    netns: bool
    engine_threads: int = 1


class FleetManifest(msgspec.Struct, kw_only=True):
    schema_version: int = SCHEMA_VERSION
    settings: FleetSettings
    root: str
    control_home: str  # the grid home of NATS, controller and gateway (authority, operator token)
    nats_url: str = ""
    gateway_url: str = ""
    admin_url: str = ""
    bridge: str | None = None
    nats: ProcessRecord | None = None
    controller: ProcessRecord | None = None
    gateway: ProcessRecord | None = None
    hosts: list[HostManifest] = []
    started_at: float = 0.0
    ready: bool = False

    def host(self, host_id: str) -> HostManifest:
        for h in self.hosts:
            if h.host_id == host_id:
                return h
        raise KeyError(f"no logical host {host_id!r} in this fleet ({', '.join(h.host_id for h in self.hosts)})")


_decoder = msgspec.json.Decoder(FleetManifest)


def state_path(root: Path) -> Path:
    return Path(root) / STATE_FILE


def load_state(root: Path) -> FleetManifest | None:
    """The recorded fleet, None when there is none; FleetStateError when the file is damaged."""
    path = state_path(root)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FleetStateError(f"cannot read the test fleet state {path}: {exc.strerror}") from exc
    try:
        state = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FleetStateError(
            f"the test fleet state {path} is damaged ({exc}); nothing was signalled. Check for leftover "
            "processes (its logs are beside it) and network namespaces named gridt-*, then remove the file"
        ) from exc
    if state.schema_version != SCHEMA_VERSION:
        raise FleetStateError(f"the test fleet state {path} has schema {state.schema_version}, this gridctl "
                              f"reads {SCHEMA_VERSION}; stop the fleet with the gridctl that started it")
    return state


def save_state(state: FleetManifest) -> None:
    """Write atomically (temp file, fsync, rename): a crash never leaves half a file."""
    path = state_path(Path(state.root))
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, msgspec.json.format(msgspec.json.encode(state), indent=2))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def remove_state(root: Path) -> None:
    state_path(root).unlink(missing_ok=True)
