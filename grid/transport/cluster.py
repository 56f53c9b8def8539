"""A JetStream cluster of nats-server processes: the configuration of each node, and a runner.

Scale-out is NATS itself: N servers joined by routes, JetStream replicating each stream on R of
them (Raft), clients holding the list of every node's URL. This module writes the `cluster`
block every node shares (`cluster_block`, also used by `gridctl nats cluster-config`) and runs
N real nodes on one machine (`NatsCluster`, used by tests and benchmarks).

Routes are authenticated: a node accepts a route only with the cluster's route secret. Without
it anyone who reaches a route port would join the cluster and receive every account's traffic,
operator mode or not (accounts are checked on client connections, not on routes).
"""

from __future__ import annotations

import secrets
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from grid.transport.embedded import (
    STREAM_INGEST_QUEUE_MSGS,
    EmbeddedNats,
    EmbeddedNatsError,
    free_port,
    start_on_free_ports,
)

ROUTE_USER = "grid-route"
DEFAULT_CLUSTER_NAME = "grid"
CLIENT_PORT = 4222
ROUTE_PORT = 6222


@dataclass(frozen=True)
class NodeAddress:
    """Where one node listens: its name, the host others reach it by, its client and route ports."""

    name: str
    host: str
    client_port: int = CLIENT_PORT
    route_port: int = ROUTE_PORT


def check_node_name(name: str) -> str:
    """Server and cluster names go into the config unquoted and into Raft: keep them plain."""
    if not name or not all(c.isalnum() or c in "-_" for c in name) or len(name) > 64:
        raise ValueError(f"{name!r} is not a usable NATS server or cluster name (letters, digits, - and _ only)")
    return name


def route_url(node: NodeAddress, secret: str) -> str:
    return f"nats-route://{ROUTE_USER}:{secret}@{node.host}:{node.route_port}"


def cluster_block(
    cluster_name: str,
    me: NodeAddress,
    nodes: Sequence[NodeAddress],
    route_secret: str,
    *,
    listen_host: str | None = None,
    route_tls: str = "",
) -> str:
    """The `cluster { ... }` block of node `me` in a cluster of `nodes` (routes to every other node).

    `route_tls` is an optional `tls { ... }` block for the route listener and dialer.
    """
    check_node_name(cluster_name)
    if len(route_secret) < 16 or not route_secret.isalnum():
        raise ValueError("the route secret must be at least 16 letters or digits")
    routes = "".join(f"    \"{route_url(n, route_secret)}\"\n" for n in nodes if n.name != me.name)
    tls = "".join(f"  {line}\n" for line in route_tls.splitlines())
    return (
        "cluster {\n"
        f"  name: {cluster_name}\n"
        f"  listen: {listen_host or me.host}:{me.route_port}\n"
        "  authorization {\n"
        f"    user: {ROUTE_USER}\n"
        f"    password: \"{route_secret}\"\n"
        "    timeout: 2\n"
        "  }\n"
        f"{tls}"
        "  routes: [\n"
        f"{routes}"
        "  ]\n"
        "}\n"
    )


def node_config(
    cluster_name: str,
    me: NodeAddress,
    nodes: Sequence[NodeAddress],
    route_secret: str,
    *,
    store_dir: Path,
    listen_host: str,
    monitor_port: int,
    monitor_host: str = "127.0.0.1",
    route_tls: str = "",
    sync_always: bool = True,
) -> str:
    """A whole node configuration (server, JetStream, cluster); operator mode and client TLS
    are appended by grid.identity. Monitoring stays on loopback: it is for the node's own
    health check, and it shows every connection."""
    sync = "  sync_interval: always\n" if sync_always else ""
    sync += f"  max_buffered_msgs: {STREAM_INGEST_QUEUE_MSGS}\n"  # (grid.transport.embedded says why)
    return (
        f"server_name: {check_node_name(me.name)}\n"
        f"listen: {listen_host}:{me.client_port}\n"
        f"http: {monitor_host}:{monitor_port}\n"
        "max_payload: 8MB\n"
        f"jetstream {{\n  store_dir: \"{store_dir}\"\n{sync}}}\n"
        + cluster_block(cluster_name, me, nodes, route_secret, listen_host=listen_host, route_tls=route_tls)
    )


def new_route_secret() -> str:
    return secrets.token_hex(24)


class ClusterNode(EmbeddedNats):
    """An `EmbeddedNats` that is one node of a cluster (ports fixed up front: every node's config
    names every other node's route port)."""

    def __init__(self, store_dir: Path, *, cluster: str, me: NodeAddress, nodes: Sequence[NodeAddress],
                 route_secret: str, **kwargs: object) -> None:
        super().__init__(store_dir, port=me.client_port, host=me.host, server_name=me.name,
                         **kwargs)  # type: ignore[arg-type]
        self.cluster_name = cluster
        self.address = me
        self.peers = tuple(nodes)
        self.route_secret = route_secret

    def extra_config(self) -> str:
        return cluster_block(self.cluster_name, self.address, self.peers, self.route_secret)


NodeFactory = Callable[..., EmbeddedNats]


class NatsCluster:
    """N real nats-server processes clustered on one host's loopback ports, JetStream on each.

    `node_factory` builds each node (default `ClusterNode`; grid.identity.server's secured
    cluster passes one that adds operator mode and TLS). Nodes can be killed, paused (SIGSTOP),
    resumed and restarted on the same ports and store, as faults in tests.
    """

    def __init__(self, base_dir: Path, *, nodes: int = 3, name: str = DEFAULT_CLUSTER_NAME,
                 host: str = "127.0.0.1", sync_always: bool = True,
                 node_factory: NodeFactory | None = None, route_secret: str | None = None) -> None:
        if nodes < 1:
            raise ValueError("a cluster has at least one node")
        self.base_dir = Path(base_dir)
        self.name = check_node_name(name)
        self.host = host
        self.route_secret = route_secret or new_route_secret()
        self._node_count = nodes
        self._node_factory = node_factory or ClusterNode
        self._sync_always = sync_always
        self.addresses: list[NodeAddress] = []
        self.nodes: list[EmbeddedNats] = []
        self._place()

    def _place(self) -> None:
        """Pick every node's ports and build its node: each config names every peer's route port."""
        self.addresses = [
            NodeAddress(f"{self.name}-n{i + 1}", self.host, free_port(self.host), free_port(self.host))
            for i in range(self._node_count)
        ]
        self.nodes = [
            self._node_factory(self.base_dir / a.name, cluster=self.name, me=a, nodes=self.addresses,
                               route_secret=self.route_secret, sync_always=self._sync_always)
            for a in self.addresses
        ]

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated: what `--nats` takes."""
        return ",".join(self.urls)

    def start(self, timeout: float = 30.0) -> "NatsCluster":
        """Start every node and wait until the cluster's JetStream is healthy. When another process
        bound a picked port before its node did, the whole cluster is placed again on new ports."""

        def start_nodes() -> None:
            for node in self.nodes:
                node.spawn()
            for node in self.nodes:
                node.wait_ready()
            self.wait_jetstream(timeout)

        try:
            start_on_free_ports(start_nodes, self.stop, repick=self._place)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_jetstream(self, timeout: float = 30.0, *, nodes: Sequence[int] | None = None) -> None:
        """Until every (live, or the given) node reports JetStream healthy, meta leader included."""
        deadline = time.monotonic() + timeout
        pending = [i for i in (nodes if nodes is not None else range(len(self.nodes)))]
        while pending and time.monotonic() < deadline:
            node = self.nodes[pending[0]]
            try:
                ok = httpx.get(f"http://{node.host}:{node.monitor_port}/healthz", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                pending.pop(0)
            else:
                time.sleep(0.1)
        if pending:
            raise EmbeddedNatsError(f"cluster nodes {pending} did not report JetStream healthy within {timeout}s")

    def index_of(self, server_name: str) -> int:
        for i, a in enumerate(self.addresses):
            if a.name == server_name:
                return i
        raise KeyError(server_name)

    def kill(self, index: int) -> None:
        """SIGKILL one node (no flush, no goodbye to its peers)."""
        node = self.nodes[index]
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGKILL)
            node.process.wait(10)

    def pause(self, index: int) -> None:
        """SIGSTOP one node: its sockets stay open but it answers nothing (a partition)."""
        proc = self.nodes[index].process
        if proc is not None:
            proc.send_signal(signal.SIGSTOP)

    def resume(self, index: int) -> None:
        proc = self.nodes[index].process
        if proc is not None:
            proc.send_signal(signal.SIGCONT)

    def restart(self, index: int) -> None:
        """Start a killed node again on its ports and store; it rejoins the cluster by itself."""
        node = self.nodes[index]
        node.respawn()
        node.wait_ready()

    def stop(self) -> None:
        for i, node in enumerate(self.nodes):
            self.resume(i)  # a stopped process would never see SIGTERM
            node.stop()

    def __enter__(self) -> "NatsCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
