"""Settings resolved from an explicit environment mapping (never read os.environ implicitly)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


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

    def ensure_home(self) -> Path:
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.home
