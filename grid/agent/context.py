"""The handles a running agent shares with its actuators and its recovery steps.

Built once per start, after the state file, the engine key and the runtime binary are known.
`state` is the agent's one mutable AgentState object (never replaced while running); `popens`
holds the Popen handles of children this process spawned (adopted children have none).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from grid.agent.artifacts import ArtifactCache
from grid.agent.options import AgentOptions
from grid.agent.ownership import EngineOwner
from grid.agent.state import AgentPaths, AgentState, ResidencyRecord
from grid.agent.warden import WARDEN_START_FAILED, ensure_warden
from grid.clock import Clock
from grid.events.host import AcceleratorDevice

MIB = 1024 * 1024


@dataclass
class AgentContext:
    options: AgentOptions
    paths: AgentPaths
    cache: ArtifactCache
    clock: Clock
    state: AgentState
    http: httpx.AsyncClient
    key: str
    binary: Path | tuple[str, ...] | None  # llama-server path or a runtime's argv prefix
    save: Callable[[], None]
    poke: Callable[[], None]
    heartbeat_now: Callable[[], Awaitable[None]]
    warn: Callable[[str], None]
    protection_state: Callable[[], str]
    owner: EngineOwner
    # The backend managed engines run on (Inventory.engine_backend): a GPU one means full offload.
    engine_backend: str = "cpu"
    # The host's accelerator devices as last read (free memory refreshed before each heartbeat).
    devices: Callable[[], tuple[AcceleratorDevice, ...]] = lambda: ()
    # Model ids of engines Grid does not own that are registered on this host (grid.agent.external).
    external_models: Callable[[], tuple[str, ...]] = lambda: ()
    popens: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def release(self, rec: ResidencyRecord, note: str) -> None:
        """The child is provably gone: drop the handle, keep the cached-artifact residency."""
        rec.process = None
        rec.port = None
        rec.spawn_argv = None
        rec.spawn_started_at = None
        rec.note = note
        self.popens.pop(rec.model_id, None)
        if rec.artifact_sha256 and self.cache.has_blob(rec.artifact_sha256):
            rec.state = "cached"
        else:
            self.state.residencies.pop(rec.model_id, None)

    def capacity_mb(self) -> int:
        return capacity_mb(self.options)

    async def guard_engines(self) -> None:
        """Make sure a warden watches this agent's engines (grid.agent.warden): before each spawn
        and after recovery kept some. An engine without one still runs; it is only not stopped
        when this agent dies and none comes back."""
        started = await asyncio.to_thread(ensure_warden, self.paths, self.owner.token, self.options.orphan_grace)
        if started.outcome == WARDEN_START_FAILED:
            self.warn(f"warden_start_failed: {started.detail}; engines outlive this agent if it dies")


def capacity_mb(options: AgentOptions) -> int:
    if options.capacity_mb is not None:
        return int(options.capacity_mb)
    return int(psutil.virtual_memory().total // MIB)


def endpoint(rec: ResidencyRecord) -> str:
    port = rec.port if rec.port is not None else (rec.process.port if rec.process else 0)
    return f"http://127.0.0.1:{port}"
