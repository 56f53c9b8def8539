"""gridctl nats cluster-config: the configuration of a secured N-node JetStream cluster.

One directory per node (config, key pairs, CA) for you to install on that node, plus this grid
home's credentials (as `gridctl nats init` writes them) so components can connect with
`--nats tls://a:4222,tls://b:4222,tls://c:4222`. Every node config fsyncs each write, and the
node names are recorded under GRID_HOME (grid.identity.durability) so the controller trusts the
cluster as durable without `--assume-durable`.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Optional

import typer

from grid.cli.common import JsonOption, config, console, fail, print_json
from grid.config import GridConfig
from grid.identity.authority import Authority
from grid.identity.clusterconfig import ClusterConfigError, ClusterLayout, write_cluster_configs
from grid.identity.durability import record_servers
from grid.identity.local import CREDS_DIR, TLS_DIR, LocalCredentials, authority_dir, ensure_local_credentials
from grid.identity.tls import TLSMaterial
from grid.secrets import load_or_create_secret, write_owner_only
from grid.transport.cluster import CLIENT_PORT, DEFAULT_CLUSTER_NAME, ROUTE_PORT

CLUSTER_DIR = "cluster"
MONITOR_PORT = 8222


def local_authority(cfg: GridConfig, now: float) -> tuple[Path, Authority, LocalCredentials]:
    """This grid home's signing authority (made on first use) and its directory, and the local
    components' credentials; also the operator token `gridctl invite` needs (the controller
    would make it on first start)."""
    cfg.ensure_home()
    directory = authority_dir(cfg.home)
    authority = Authority(directory)
    credentials = ensure_local_credentials(cfg.home, host_ids=[], now=now)
    load_or_create_secret(cfg.operator_token_path)
    return directory, authority, credentials


def cluster_config(
    nodes: int = typer.Option(3, "--nodes", min=1, max=9, help="Number of NATS servers (3 tolerates the loss of one)."),
    name: str = typer.Option(DEFAULT_CLUSTER_NAME, "--name", help="Cluster name; nodes are named NAME-n1, NAME-n2, ..."),
    host: list[str] = typer.Option(
        [], "--host", help="Host (name or IP) clients and peers reach a node by: once per node, in order, or once "
                           "for all nodes on one machine (consecutive ports)."),
    client_port: int = typer.Option(CLIENT_PORT, "--client-port", help="Client port (first node's, on one machine)."),
    route_port: int = typer.Option(ROUTE_PORT, "--route-port", help="Route port between nodes (first node's, on one machine)."),
    monitor_port: int = typer.Option(MONITOR_PORT, "--monitor-port",
                                     help="Monitoring port, on the node's loopback only (first node's, on one machine)."),
    output: Optional[Path] = typer.Option(
        None, "--output", help="Where to write one directory per node (default: GRID_HOME/identity/cluster)."),
    config_dir: Optional[Path] = typer.Option(
        None, "--config-dir", help="Where those node directories will be on the servers, if not at --output "
                                   "(paths inside each config point there)."),
    store_dir: Optional[Path] = typer.Option(
        None, "--store-dir", help="JetStream store directory on each node (default: inside the node's directory)."),
    resolver_dir: Optional[Path] = typer.Option(
        None, "--resolver-dir", help="Account resolver directory on each node (default: inside the node's directory)."),
    tls: bool = typer.Option(True, "--tls/--no-tls", help="TLS on client ports and mutual TLS on routes "
                                                          "(--no-tls only when every host is loopback)."),
    gateway_home: Optional[Path] = typer.Option(
        None, "--gateway-home", help="Also give a gateway running with this GRID_HOME its own credential (and the CA)."),
    json_out: bool = JsonOption,
) -> None:
    """Write the configs of a secured JetStream cluster (accounts, TLS, authenticated routes)."""
    try:
        layout = ClusterLayout.plan(name, nodes, host, client_port=client_port, route_port=route_port,
                                    monitor_port=monitor_port)
    except (ClusterConfigError, ValueError) as exc:
        fail(str(exc))
        return
    cfg = config()
    now = time.time()
    directory, authority, credentials = local_authority(cfg, now)
    material = TLSMaterial(directory / TLS_DIR).ensure(layout.hosts, now=dt.datetime.now(dt.timezone.utc)) if tls else None
    out = (output or directory / CLUSTER_DIR).expanduser()
    try:
        paths = write_cluster_configs(authority, layout, out, tls=material, config_dir=config_dir,
                                      store_dir=store_dir, resolver_dir=resolver_dir, now=now)
    except ClusterConfigError as exc:
        fail(str(exc))
        return
    record_servers(cfg.home, [(n.name, p) for n, p in zip(layout.nodes, paths, strict=True)], sync_always=True,
                   written_by="gridctl nats cluster-config", now=now)
    if gateway_home is not None:
        target = authority_dir(gateway_home) / CREDS_DIR / "gateway.creds"
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_owner_only(target, credentials.gateway.read_bytes())
        if material is not None:
            (authority_dir(gateway_home) / TLS_DIR).mkdir(parents=True, exist_ok=True, mode=0o700)
            write_owner_only(authority_dir(gateway_home) / TLS_DIR / "ca.pem", material.ca_cert.read_bytes())
    scheme = "tls" if material is not None else "nats"
    url = ",".join(f"{scheme}://{u}" for u in layout.client_urls)
    if json_out:
        print_json({"cluster": layout.name, "nodes": [{"name": n.name, "config": str(p), "host": n.host,
                                                       "client_port": n.client_port, "route_port": n.route_port}
                                                      for n, p in zip(layout.nodes, paths, strict=True)],
                    "nats_url": url, "tls_fingerprint": material.server_fingerprint() if material else None})
        return
    for n, p in zip(layout.nodes, paths, strict=True):
        if config_dir is not None and config_dir.expanduser() / n.name != p.parent:
            there = config_dir.expanduser() / n.name
            console.print(f"{n.name}: copy {p.parent} to {there} on {n.host}, then there: nats-server -c "
                          f"{there / p.name}", highlight=False, soft_wrap=True)
        else:
            console.print(f"{n.name}: nats-server -c {p}", highlight=False, soft_wrap=True)
    console.print(f"then: gridctl serve controller --nats {url}", highlight=False, soft_wrap=True)
    console.print("streams and the lease bucket get 3 replicas on 3+ nodes (--replicas / GRID_REPLICAS to choose)",
                  style="dim")
