"""Settings resolved from an explicit environment mapping (never read os.environ implicitly)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from grid.secrets import ensure_private_dir, tighten_tree

NATS_URL_FILE = "nats.url"  # written by a running `gridctl up`, removed when it stops
# Written by `gridctl machine join` (grid.identity.bundle): the role this machine joined as and
# the grid's NATS and admin URLs, the last place URL lookups fall back to.
MACHINE_FILE = "machine.json"


class NatsUrlNotFound(LookupError):
    """No NATS URL was given and no running local grid recorded one under the grid home."""

    def __init__(self, recorded: Path) -> None:
        super().__init__(f"no NATS URL given and no running grid recorded one at {recorded}")
        self.recorded = recorded


# JetStream replicates a stream on at most five servers.
MAX_REPLICAS = 5


class ConfigError(ValueError):
    """A setting in the environment that cannot be used (the message names it and says why)."""


def parse_replicas(value: str | int | None, *, source: str = "GRID_REPLICAS") -> int | None:
    """The replica count of the streams and the lease bucket: None (automatic: 1 on a single
    server, 3 on a cluster of three or more nodes) or 1..5."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(f"{source} must be a whole number from 1 to {MAX_REPLICAS}, not {value!r}") from None
    if not 1 <= n <= MAX_REPLICAS:
        raise ConfigError(f"{source} must be from 1 to {MAX_REPLICAS} (JetStream's limit), not {n}")
    return n


@dataclass(frozen=True)
class GridConfig:
    home: Path
    nats_url: str | None
    # GRID_REPLICAS as given: parsed (and refused when bad) only by the processes that manage
    # streams, so a bad value does not break every other command.
    replicas_setting: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "GridConfig":
        env = os.environ if environ is None else environ
        home = Path(env.get("GRID_HOME") or Path(env.get("HOME", "~")) / ".grid").expanduser()
        return cls(home=home, nats_url=env.get("GRID_NATS_URL") or None,
                   replicas_setting=env.get("GRID_REPLICAS") or None)

    def replicas(self) -> int | None:
        """Stream and lease-bucket replicas from GRID_REPLICAS (None: automatic); ConfigError
        when the value is not 1..5."""
        return parse_replicas(self.replicas_setting)

    @property
    def nats_url_file(self) -> Path:
        return self.home / NATS_URL_FILE

    @property
    def machine_file(self) -> Path:
        return self.home / MACHINE_FILE

    @property
    def nats_store_dir(self) -> Path:
        return self.home / "nats"

    @property
    def duckdb_path(self) -> Path:
        return self.home / "analytics.duckdb"

    @property
    def snapshots_dir(self) -> Path:
        return self.home / "snapshots"

    @property
    def artifacts_dir(self) -> Path:
        return self.home / "artifacts"

    @property
    def operator_token_path(self) -> Path:
        return self.home / "operator.token"

    @property
    def reader_token_path(self) -> Path:
        """The read-only credential (dashboard, status, history); see grid.secrets."""
        return self.home / "reader.token"

    def ensure_home(self) -> Path:
        """The grid home, owner-only: created 0700, or an existing one tightened with everything
        in it (directories 0700, files 0600; credentials are left to their readers, which refuse
        them). A warning names each path tightened and its old mode; PrivateModeError (naming
        the path and the chmod that fixes it) when one is not ours to change."""
        ensure_private_dir(self.home)
        tighten_tree(self.home)
        return self.home


def machine_urls(home: Path, key: str) -> list[str]:
    """The URLs `gridctl machine join` recorded under `key` ("nats_urls", "admin_urls") in the
    grid home's machine.json; [] without one. Read only as the last fallback of a URL lookup, so
    an unreadable or malformed file counts as none: the caller's "not found" message then says
    what to pass instead, rather than failing on a file the user may not know about."""
    try:
        record = json.loads((Path(home) / MACHINE_FILE).read_text())
    except (OSError, ValueError):
        return []
    urls = record.get(key) if isinstance(record, dict) else None
    if not isinstance(urls, list):
        return []
    return [u.strip() for u in urls if isinstance(u, str) and u.strip()]


def resolve_nats_url(explicit: str | None, cfg: GridConfig) -> str:
    """The NATS URL a component should use: `explicit` (--nats), else the environment's
    GRID_NATS_URL (already in `cfg`), else the URL a running `gridctl up` recorded, else the
    servers `gridctl machine join` recorded in machine.json (comma-separated, as --nats takes a
    cluster's).

    Raises NatsUrlNotFound when there is none; callers turn it into their own message.
    """
    if explicit:
        return explicit
    if cfg.nats_url:
        return cfg.nats_url
    recorded = cfg.nats_url_file
    try:
        url = recorded.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        url = ""
    if not url:
        url = ",".join(machine_urls(cfg.home, "nats_urls"))
    if not url:
        raise NatsUrlNotFound(recorded)
    return url
