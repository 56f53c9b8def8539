"""nats-server in operator mode: the authority's accounts, optionally TLS; one server or a cluster."""

from __future__ import annotations

import datetime as dt
import functools
import time
from pathlib import Path

from grid.identity.authority import Authority
from grid.identity.routetls import ensure_route_cert, route_tls_config
from grid.identity.tls import TLSMaterial
from grid.transport.cluster import ClusterNode, NatsCluster, cluster_block
from grid.transport.embedded import EmbeddedNats


def secured_config(authority: Authority, resolver_dir: Path, tls: TLSMaterial | None, *, now: float,
                   make_resolver_dir: bool = True) -> str:
    """The lines that turn a server's config into operator mode (and TLS on the client port)."""
    extra = authority.server_config(now=now, resolver_dir=resolver_dir, make_resolver_dir=make_resolver_dir)
    if tls is not None:
        extra += tls.server_config()
    return extra


class SecuredEmbeddedNats(EmbeddedNats):
    """`EmbeddedNats` whose config also trusts `authority`'s operator (and serves TLS from
    `tls`), so every client needs a credential the authority issued."""

    def __init__(self, store_dir: Path, authority: Authority, *, tls: TLSMaterial | None = None,
                 **kwargs: object) -> None:
        super().__init__(store_dir, **kwargs)  # type: ignore[arg-type]
        self.authority = authority
        self.tls = tls

    def extra_config(self) -> str:
        return super().extra_config() + secured_config(self.authority, self.store_dir / "resolver", self.tls,
                                                       now=time.time())

    def _write_config(self) -> Path:
        path = super()._write_config()
        path.chmod(0o600)  # the route secret and account JWTs
        return path

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls is not None else 'nats'}://{self.connect_host}:{self.port}"


class SecuredClusterNode(ClusterNode):
    """One node of a secured cluster: operator mode, each node with its own resolver store."""

    def __init__(self, store_dir: Path, *, authority: Authority, tls: TLSMaterial | None = None,
                 **kwargs: object) -> None:
        super().__init__(store_dir, **kwargs)  # type: ignore[arg-type]
        self.authority = authority
        self.tls = tls

    def extra_config(self) -> str:
        route_tls = ""
        if self.tls is not None:
            names = sorted({p.host for p in self.peers})
            cert, key = ensure_route_cert(self.tls, names, now=dt.datetime.now(dt.timezone.utc))
            route_tls = route_tls_config(cert, key, self.tls.ca_cert)
        return (cluster_block(self.cluster_name, self.address, self.peers, self.route_secret, route_tls=route_tls)
                + secured_config(self.authority, self.store_dir / "resolver", self.tls, now=time.time()))

    def _write_config(self) -> Path:
        path = super()._write_config()
        path.chmod(0o600)
        return path

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls is not None else 'nats'}://{self.host}:{self.port}"


class SecuredNatsCluster(NatsCluster):
    """`NatsCluster` whose nodes all trust `authority` (and serve TLS from `tls`, whose server
    certificate must name the cluster's host)."""

    def __init__(self, base_dir: Path, authority: Authority, *, tls: TLSMaterial | None = None,
                 **kwargs: object) -> None:
        factory = functools.partial(SecuredClusterNode, authority=authority, tls=tls)
        super().__init__(base_dir, node_factory=factory, **kwargs)  # type: ignore[arg-type]
        self.authority = authority
        self.tls = tls
