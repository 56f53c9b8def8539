"""The agent's durable state: one owner-only JSON file, written atomically.

Write path: encode -> temp file (0600) -> fsync -> rename -> fsync the directory. A file that
does not decode is never trusted: it is renamed aside with a timestamp (quarantined), the agent
starts clean and reports a warning. Decoding is strict: an unknown key (a renamed or misspelt
field) or a missing fence field is damage, never a default, because a fence that silently
reads as 0 would let a deposed controller's commands through. (A quarantined file's fence is
then restored from this host's last heartbeat in the log: grid.agent.recovery.) Every other
agent file (host id, overrides, pid file, lock, engine key) lives in the same owner-only
directory.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from grid.config import GridConfig
from grid.secrets import ensure_private_dir

SCHEMA_VERSION = 1
MAX_RECEIPTS = 2048

WARNING_STATE_QUARANTINED = "state_file_quarantined"


class ProcessProof(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What we know about a child we spawned: enough to prove a PID is still ours."""

    pid: int
    port: int
    exe: str | None = None
    cmdline: tuple[str, ...] | None = None
    # psutil create_time (process birth marker); None until enriched after spawn.
    create_time: float | None = None
    # grid.procstart.start_stamp: the birth marker wall-clock corrections do not move (Linux).
    start_stamp: str | None = None


class ResidencyRecord(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model_id: str
    # grid.events.host.ResidencyState
    state: str
    memory_mb: int = 0
    artifact_sha256: str | None = None
    model_path: str | None = None
    port: int | None = None
    process: ProcessProof | None = None
    slots: int = 1
    context_size: int = 2048
    # Wall-clock times, only used to report ages (the controller reconstructs from receipt time).
    loaded_at: float | None = None
    last_used_at: float | None = None
    action_id: str = ""
    note: str = ""
    # Written before the spawn: the exact argv and the wall time the spawn began. They let a
    # restart complete the ownership proof of a child whose PID or birth marker was not yet
    # persisted when the agent died (exact argv + born after the spawn began).
    spawn_argv: tuple[str, ...] | None = None
    spawn_started_at: float | None = None
    # Accelerator device indexes the engine was started on (empty: CPU or unified memory).
    devices: tuple[int, ...] = ()


class Receipt(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The terminal outcome of one action: makes redelivery and duplicates no-ops."""

    action_id: str
    kind: str = ""
    model_id: str = ""
    status: str
    message: str = ""
    duration_seconds: float | None = None
    artifact_fetched: bool = False
    generation: str = ""
    controller_term: int = 0
    finished_at: float = 0.0
    # Whether the terminal ActionAck reached the log (republished at start if not).
    published: bool = False


class InFlight(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    action_id: str
    kind: str
    model_id: str
    started_at: float
    generation: str = ""
    controller_term: int = 0


class AgentState(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    schema_version: int = SCHEMA_VERSION
    host_id: str = ""
    # Fencing: the highest controller term ever accepted and the one controller id of that term.
    highest_term: int = 0
    term_controller_id: str = ""
    # Latest accepted plan generation (epoch, sequence); sequence -1 means none yet.
    generation_epoch: str = ""
    generation_sequence: int = -1
    receipts: list[Receipt] = []
    in_flight: InFlight | None = None
    residencies: dict[str, ResidencyRecord] = {}
    protection_state: str = "accepting"
    protection_reason: str = ""
    protection_sensor_state: str = "accepting"
    protection_sensor_reason: str = ""
    protection_since: float = 0.0

    def receipt(self, action_id: str) -> Receipt | None:
        for r in reversed(self.receipts):
            if r.action_id == action_id:
                return r
        return None

    def add_receipt(self, receipt: Receipt) -> None:
        self.receipts = [r for r in self.receipts if r.action_id != receipt.action_id]
        self.receipts.append(receipt)
        if len(self.receipts) > MAX_RECEIPTS:
            self.receipts = self.receipts[-MAX_RECEIPTS:]


# Fields that must be present in the file: the fence and the identity it belongs to. Other
# fields may be added later with defaults (older files still decode).
REQUIRED_FIELDS: tuple[str, ...] = (
    "schema_version", "host_id", "highest_term", "term_controller_id", "generation_epoch", "generation_sequence",
)

_encoder = msgspec.json.Encoder(order="deterministic")
_decoder = msgspec.json.Decoder(AgentState)
_keys_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])


@dataclass(frozen=True)
class AgentPaths:
    """Every file the agent owns, under one owner-only directory (default GRID_HOME/agent)."""

    root: Path

    @classmethod
    def for_config(cls, config: GridConfig, state_dir: Path | None = None) -> "AgentPaths":
        return cls(Path(state_dir) if state_dir is not None else config.home / "agent")

    @property
    def host_id(self) -> Path:
        return self.root / "host_id"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def override(self) -> Path:
        return self.root / "override.json"

    @property
    def hardware(self) -> Path:
        """The hardware the agent last reported (grid.fleet.hardware row), for `node status`."""
        return self.root / "hardware.json"

    @property
    def pid_file(self) -> Path:
        return self.root / "agent.pid"

    @property
    def engine_key(self) -> Path:
        return self.root / "engine.key"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def ensure(self) -> None:
        ensure_private_dir(self.root)
        ensure_private_dir(self.logs)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """temp file (owner-only) -> fsync -> rename -> fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def quarantine_file(path: Path, now: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now if now is not None else time.time()))
    target = path.with_name(f"{path.name}.corrupt-{stamp}-{os.getpid()}")
    os.replace(path, target)
    fsync_dir(path.parent)
    return target


class StateStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> tuple[AgentState, str | None]:
        """The persisted state, or a clean one plus a warning when the file was corrupt."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return AgentState(), None
        try:
            state = decode_state(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            target = quarantine_file(self.path)
            return AgentState(), f"{WARNING_STATE_QUARANTINED}: {target.name} ({str(exc)[:160]})"
        return state, None

    def save(self, state: AgentState) -> None:
        atomic_write(self.path, _encoder.encode(state))


def encode_state(state: AgentState) -> bytes:
    return _encoder.encode(state)


def decode_state(data: bytes) -> AgentState:
    """Strict decode (raises msgspec.DecodeError / ValidationError on any damage)."""
    state = _decoder.decode(data)
    missing = [name for name in REQUIRED_FIELDS if name not in _keys_decoder.decode(data)]
    if missing:
        raise msgspec.ValidationError(f"missing required field(s) {', '.join(missing)}")
    if state.schema_version != SCHEMA_VERSION:
        raise msgspec.ValidationError(f"unsupported schema_version {state.schema_version}")
    return state
