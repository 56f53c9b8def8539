"""Settings resolved from an explicit environment mapping (never read os.environ implicitly)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


NATS_URL_FILE = "nats.url"  # written by a running `gridctl up`, removed when it stops


class NatsUrlNotFound(LookupError):
    """No NATS URL was given and no running local grid recorded one under the grid home."""

    def __init__(self, recorded: Path) -> None:
        super().__init__(f"no NATS URL given and no running grid recorded one at {recorded}")
        self.recorded = recorded


@dataclass(frozen=True)
class GridConfig:
    home: Path
    nats_url: str | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "GridConfig":
        env = os.environ if environ is None else environ
        home = Path(env.get("GRID_HOME") or Path(env.get("HOME", "~")) / ".grid").expanduser()
        return cls(home=home, nats_url=env.get("GRID_NATS_URL") or None)

    @property
    def nats_url_file(self) -> Path:
        return self.home / NATS_URL_FILE

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
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.home


def resolve_nats_url(explicit: str | None, cfg: GridConfig) -> str:
    """The NATS URL a component should use: `explicit` (--nats), else the environment's
    GRID_NATS_URL (already in `cfg`), else the URL a running `gridctl up` recorded.

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
        raise NatsUrlNotFound(recorded)
    return url
