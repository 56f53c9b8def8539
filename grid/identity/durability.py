"""What this grid home knows about an external NATS server's durability.

Automatic mode needs a log that fsyncs every write. An external server says so only in its
VARZ, which the controller's credential may not ask for in operator mode (`$SYS.REQ.SERVER.PING.
VARZ` is the system account's). But when Grid wrote that server's configuration itself
(`gridctl nats init` writes a whole server config beside its snippet, `gridctl nats cluster-config`
one per node), it knows: those configs set `sync_interval: always` and a `server_name`, and this
module records the names under GRID_HOME/identity. A server that connects under a recorded
name, with this home's credentials (so it runs this grid's operator configuration), is trusted
as durable without `--assume-durable`; any other server still is not, unless it reports
`sync_always` itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from grid.identity.local import authority_dir
from grid.secrets import write_owner_only

DURABILITY_FILE = "nats-durability.json"


class ServerRecord(msgspec.Struct, kw_only=True):
    sync_always: bool
    config: str = ""
    written_by: str = ""
    at: float = 0.0


class DurabilityRecord(msgspec.Struct, kw_only=True):
    # server_name -> what the config Grid wrote for it sets
    servers: dict[str, ServerRecord] = msgspec.field(default_factory=dict)


def record_path(home: Path) -> Path:
    return authority_dir(home) / DURABILITY_FILE


def read_record(home: Path) -> DurabilityRecord:
    try:
        return msgspec.json.decode(record_path(home).read_bytes(), type=DurabilityRecord)
    except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
        return DurabilityRecord()


def record_servers(home: Path, servers: Iterable[tuple[str, Path]], *, sync_always: bool, written_by: str,
                   now: float | None = None) -> Path:
    """Record that Grid wrote each (server_name, config) with this sync policy (merged with the
    servers recorded before; a name written again is replaced)."""
    record = read_record(home)
    at = time.time() if now is None else now
    for name, config in servers:
        record.servers[name] = ServerRecord(sync_always=sync_always, config=str(config), written_by=written_by, at=at)
    path = record_path(home)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_owner_only(path, msgspec.json.format(msgspec.json.encode(record), indent=2) + b"\n")
    return path


def connected_server_name(event_log: Any) -> str | None:
    """The `server_name` the connected server announced in its INFO (nats-py keeps it only there)."""
    client = getattr(event_log, "client", None) or getattr(event_log, "_nc", None)
    info = getattr(client, "_server_info", None) or {}
    name = info.get("server_name")
    return str(name) if name else None


def recorded_sync_always(home: Path, server_name: str | None) -> bool:
    """Whether a config Grid wrote for `server_name` under this home fsyncs every write."""
    if not server_name:
        return False
    server = read_record(home).servers.get(server_name)
    return bool(server and server.sync_always)


async def external_log_durable(event_log: Any, home: Path) -> tuple[bool, bool | None, str | None]:
    """(durable, what the server reported, the recorded server it was trusted as or None).

    The server's own report wins when it gives one; otherwise a server Grid configured under this
    home, recognised by its name, counts as durable. A connection with a credential (operator
    mode) does not ask: only the system account may, and the server would answer the request
    with a permissions violation, which the client logs as a connection error."""
    reported = None if getattr(event_log, "authorship", None) is not None else await event_log.server_syncs_always()
    if reported is None:
        name = connected_server_name(event_log)
        if recorded_sync_always(home, name):
            return True, None, name
    return bool(reported), reported, None
