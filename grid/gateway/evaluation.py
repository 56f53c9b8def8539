"""Who may mark inference as an evaluation: only the grid's owner.

An evaluation-marked request still teaches per-engine throughput, but it creates no demand and
no service evidence (its quality is recorded separately at POST /allocator/evaluations). If any
client could mark its requests, it could hide its demand from the allocator, so marking needs
the owner capability: the operator token, presented in ``X-Grid-Evaluation-Token``. A request
that presents anything else is refused (403) rather than served unmarked, so the caller learns
its evaluation would not have counted.

The token is read from GRID_GATEWAY_OWNER_TOKEN_FILE, else the grid home's operator token
(created by the controller; read again until it exists). Only its sha256 is kept.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from pathlib import Path

from grid.secrets import SecretFileError, read_secret

HEADER = b"x-grid-evaluation-token"
OWNER_TOKEN_FILE_ENV = "GRID_GATEWAY_OWNER_TOKEN_FILE"
# Header values longer than this are not tokens (refused without hashing a megabyte).
MAX_TOKEN_BYTES = 512


class OwnerCapability:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._digest: bytes | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], default_path: Path | None) -> OwnerCapability:
        explicit = environ.get(OWNER_TOKEN_FILE_ENV, "").strip()
        return cls(Path(explicit).expanduser() if explicit else default_path)

    def _load(self) -> bytes | None:
        if self._digest is None and self.path is not None:
            try:
                self._digest = hashlib.sha256(read_secret(self.path).encode()).digest()
            except (OSError, SecretFileError):
                return None  # no owner token yet (or an unsafe one): nobody may mark evaluations
        return self._digest

    def check(self, presented: bytes) -> bool:
        """True when `presented` is the owner token (constant-time over digests)."""
        value = presented.strip()
        if not value or len(value) > MAX_TOKEN_BYTES:
            return False
        digest = self._load()
        return digest is not None and hmac.compare_digest(hashlib.sha256(value).digest(), digest)
