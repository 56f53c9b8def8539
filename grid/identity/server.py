"""The embedded nats-server in operator mode: the authority's accounts, optionally TLS."""

from __future__ import annotations

import time
from pathlib import Path

from grid.events.embedded import EmbeddedNats
from grid.identity.authority import Authority
from grid.identity.tls import TLSMaterial


class SecuredEmbeddedNats(EmbeddedNats):
    """`EmbeddedNats` whose config also trusts `authority`'s operator (and serves TLS from
    `tls`), so every client needs a credential the authority issued."""

    def __init__(self, store_dir: Path, authority: Authority, *, tls: TLSMaterial | None = None,
                 **kwargs: object) -> None:
        super().__init__(store_dir, **kwargs)  # type: ignore[arg-type]
        self.authority = authority
        self.tls = tls

    def _write_config(self) -> Path:
        path = super()._write_config()
        extra = self.authority.server_config(now=time.time(), resolver_dir=self.store_dir / "resolver")
        if self.tls is not None:
            extra += self.tls.server_config()
        path.write_text(path.read_text() + extra)
        path.chmod(0o600)
        return path

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls is not None else 'nats'}://{self.host}:{self.port}"
