"""The configuration files of a secured N-node JetStream cluster (`gridctl nats cluster-config`).

One directory per node, holding everything that node's nats-server reads and nothing else: its
config (server, JetStream with fsync on every write, the cluster block with the route secret,
operator mode with the authority's accounts, TLS on the client port) and the key pairs it
presents (client port, routes) with the CA. Paths inside a config are where that directory
will be on the node (`config_dir`), which need not be where it is written (`output`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from grid.identity.authority import Authority
from grid.identity.routetls import ROUTE_CERT, ROUTE_KEY, ensure_route_cert, route_tls_config
from grid.identity.server import secured_config
from grid.identity.tls import TLSMaterial
from grid.secrets import load_or_create_secret, write_owner_only
from grid.transport.cluster import NodeAddress, check_node_name, node_config

CONFIG_FILE = "nats.conf"
ROUTE_SECRET_FILE = "route.secret"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ClusterConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ClusterLayout:
    """Which nodes, where: N hosts with the same ports, or one host with consecutive ports."""

    name: str
    nodes: tuple[NodeAddress, ...]
    monitor_ports: tuple[int, ...]
    listen_host: str

    @classmethod
    def plan(cls, name: str, count: int, hosts: list[str], *, client_port: int, route_port: int,
             monitor_port: int) -> "ClusterLayout":
        check_node_name(name)
        if count < 1:
            raise ClusterConfigError("--nodes must be at least 1")
        if not hosts:
            raise ClusterConfigError("give each node's host with --host (once per node, or once for one machine)")
        if len(hosts) == 1 and count > 1:
            # One machine (trials, tests): consecutive ports, listening on that host only.
            nodes = tuple(NodeAddress(f"{name}-n{i + 1}", hosts[0], client_port + i, route_port + i)
                          for i in range(count))
            return cls(name, nodes, tuple(monitor_port + i for i in range(count)), hosts[0])
        if len(hosts) != count:
            raise ClusterConfigError(f"--nodes {count} needs {count} --host values (or one), not {len(hosts)}")
        if len(set(hosts)) != len(hosts):
            raise ClusterConfigError("each --host must name a different machine (or give one --host for one machine)")
        nodes = tuple(NodeAddress(f"{name}-n{i + 1}", h, client_port, route_port) for i, h in enumerate(hosts))
        # One node per machine: listen on every interface of it (a container's, typically).
        return cls(name, nodes, (monitor_port,) * count, "0.0.0.0")

    @property
    def hosts(self) -> list[str]:
        return sorted({n.host for n in self.nodes})

    @property
    def loopback_only(self) -> bool:
        return all(h in LOOPBACK for h in self.hosts)

    @property
    def client_urls(self) -> list[str]:
        return [f"{n.host}:{n.client_port}" for n in self.nodes]


def route_secret(authority: Authority) -> str:
    """The cluster's route secret, made once beside the authority (re-running keeps it)."""
    return load_or_create_secret(authority.directory / ROUTE_SECRET_FILE, 24)


def write_cluster_configs(
    authority: Authority,
    layout: ClusterLayout,
    output: Path,
    *,
    tls: TLSMaterial | None,
    config_dir: Path | None = None,
    store_dir: Path | None = None,
    resolver_dir: Path | None = None,
    now: float,
) -> list[Path]:
    """Write `output/<node>/nats.conf` (and the node's key pairs) for every node of `layout`."""
    if tls is None and not layout.loopback_only:
        raise ClusterConfigError("a cluster reachable off loopback needs TLS (drop --no-tls)")
    output.mkdir(parents=True, exist_ok=True, mode=0o700)
    config_dir = config_dir or output
    secret = route_secret(authority)
    route_pair = None
    if tls is not None:
        route_pair = ensure_route_cert(tls, layout.hosts, now=dt.datetime.fromtimestamp(now, dt.timezone.utc))
    paths = []
    for me, monitor in zip(layout.nodes, layout.monitor_ports, strict=True):
        written = output / me.name
        there = config_dir / me.name
        written.mkdir(parents=True, exist_ok=True, mode=0o700)
        node_tls = None
        route_tls = ""
        if tls is not None and route_pair is not None:
            node_tls = TLSMaterial(there)
            copies = {tls.ca_cert: "ca.pem", tls.server_cert: "server.pem", tls.server_key: "server.key",
                      route_pair[0]: ROUTE_CERT, route_pair[1]: ROUTE_KEY}
            for source, name in copies.items():
                write_owner_only(written / name, source.read_bytes())
            route_tls = route_tls_config(there / ROUTE_CERT, there / ROUTE_KEY, there / "ca.pem")
        # Nodes sharing a machine must not share a store: each gets its own subdirectory.
        shared = layout.listen_host != "0.0.0.0" and len(layout.nodes) > 1
        store = (store_dir / me.name if shared else store_dir) if store_dir else there / "jetstream"
        resolver = (resolver_dir / me.name if shared else resolver_dir) if resolver_dir else there / "resolver"
        text = node_config(layout.name, me, layout.nodes, secret, store_dir=store,
                           listen_host=layout.listen_host, monitor_port=monitor, route_tls=route_tls)
        # Like `gridctl nats init --resolver-dir`, the resolver directory is made here too, unless
        # the config's paths are on the node (--config-dir elsewhere): nothing is written there.
        text += secured_config(authority, resolver, node_tls, now=now, make_resolver_dir=there == written)
        path = written / CONFIG_FILE
        write_owner_only(path, text.encode())
        paths.append(path)
    return paths
