"""Proof of ownership a Grid child carries itself, so it can be found without the state file.

Every child is spawned with an owner token in its environment: HMAC(fleet engine secret, the
agent's state directory), plus the host id and memory budget it was started for. Only the same
user (or root) can read a process's environment, the token cannot be derived without the
secret, and it names one state directory, so two agents on one machine never claim each
other's children. A child found this way is identified by its exact (pid, exe, cmdline, birth
time) at discovery; every later signal re-proves that tuple (llama_cpp.stop_process).

The token is not a secret to the user who owns the process but it is never logged or put in an
event.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

import msgspec
import psutil

from grid.agent.state import ProcessProof
from grid.procstart import start_stamp

OWNER_ENV = "GRID_ENGINE_OWNER"
HOST_ENV = "GRID_ENGINE_HOST"
MEMORY_ENV = "GRID_ENGINE_MEMORY_MB"


def owner_token(fleet_secret: str, state_dir: Path) -> str:
    return hmac.new(
        fleet_secret.encode(), f"engine-owner:{Path(state_dir).resolve()}".encode(), hashlib.sha256
    ).hexdigest()


@dataclass(frozen=True)
class EngineOwner:
    """What a child is told about who owns it (passed into its environment at spawn)."""

    token: str
    host_id: str

    def environ(self, memory_mb: int) -> dict[str, str]:
        return {OWNER_ENV: self.token, HOST_ENV: self.host_id, MEMORY_ENV: str(int(memory_mb))}


@dataclass(frozen=True)
class OwnedEngine:
    """A live child carrying our owner token, with what its command line says it serves."""

    proof: ProcessProof
    host_id: str
    model_id: str
    model_path: str
    key_file: str
    slots: int
    context_size: int
    memory_mb: int


def _flag(argv: tuple[str, ...], name: str) -> str | None:
    try:
        return argv[argv.index(name) + 1]
    except (ValueError, IndexError):
        return None


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def parse_engine(proc: psutil.Process, token: str) -> OwnedEngine | None:
    """The engine `proc` runs for the owner of `token`, or None (not ours, gone, unreadable)."""
    try:
        with proc.oneshot():
            env = proc.environ()
            claimed = env.get(OWNER_ENV, "")
            if not claimed or not hmac.compare_digest(claimed.encode(), token.encode()):
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            argv = tuple(proc.cmdline())
            proof = ProcessProof(pid=proc.pid, port=0, exe=proc.exe(), cmdline=argv, create_time=proc.create_time(),
                                 start_stamp=start_stamp(proc.pid))
    except (psutil.Error, OSError):
        return None
    model_id, port, model_path = _flag(argv, "--alias"), _flag(argv, "--port"), _flag(argv, "--model")
    key_file = _flag(argv, "--api-key-file")
    if not (model_id and port and model_path and key_file) or not port.isdigit():
        # Ours by token but not an engine command line we can serve from: stop-only.
        model_id, port = model_id or "", port if port and port.isdigit() else "0"
    slots = max(1, _int(_flag(argv, "--parallel"), 1))
    return OwnedEngine(
        proof=msgspec.structs.replace(proof, port=int(port)),
        host_id=env.get(HOST_ENV, ""),
        model_id=model_id or "",
        model_path=model_path or "",
        key_file=key_file or "",
        slots=slots,
        context_size=max(1, _int(_flag(argv, "--ctx-size"), 2048 * slots) // slots),
        memory_mb=max(0, _int(env.get(MEMORY_ENV), 0)),
    )


def find_owned_engines(token: str) -> list[OwnedEngine]:
    """Every live child on this machine carrying `token`, oldest first (blocking; run in a thread)."""
    found = []
    for proc in psutil.process_iter():
        engine = parse_engine(proc, token)
        if engine is not None:
            found.append(engine)
    return sorted(found, key=lambda e: (e.proof.create_time or 0.0, e.proof.pid))
