"""Which logical host this state directory is: the stable host id, created once and kept."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from grid.agent.state import AgentPaths, atomic_write
from grid.config import GridConfig


class HostIdError(RuntimeError):
    pass

def stored_host_id(paths: AgentPaths) -> str:
    try:
        return paths.host_id.read_text().strip()
    except FileNotFoundError:
        return ""

def resolve_host_id(paths: AgentPaths, requested: str | None, recovered: str | None = None) -> str:
    """The stable host id persisted at <state dir>/host_id (created once).

    When that file is missing or empty, `recovered` (the id the state file or the live children
    still carry) is kept, so a damaged id file never turns one host into two."""
    paths.ensure()
    stored = stored_host_id(paths)
    if stored:
        if requested and requested != stored:
            raise HostIdError(
                f"this agent state dir belongs to host {stored!r}, not {requested!r} "
                f"(use another --state-dir / GRID_HOME for another logical host)"
            )
        return stored
    host_id = requested or recovered or f"host-{uuid.uuid4().hex[:12]}"
    atomic_write(paths.host_id, (host_id + "\n").encode())
    return host_id

def default_state_dir(config: GridConfig) -> Path:
    return config.home / "agent"

def agent_environ_state_dir(environ: dict[str, str] | None = None) -> Path | None:
    env = os.environ if environ is None else environ
    value = env.get("GRID_AGENT_STATE_DIR")
    return Path(value) if value else None
