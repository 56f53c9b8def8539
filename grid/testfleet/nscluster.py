"""A secured 3-node TLS NATS cluster with each node in its own network namespace, so one node
can be made silent (every packet in and out of its namespace dropped) while its process runs.

A process that dies closes its sockets and its clients notice at once; a node behind a
partition, or a hung host, answers nothing and is only noticed by unanswered pings. This is
that fault, with the real nats-server and the TLS and credentials the README's cluster uses.

Only objects named with the `gridc` prefix inside 10.214.0.0/24 are made, and `stop()` removes
exactly those (the test fleet, grid.testfleet.netns, uses `gridt` and 10.213.0.0/24).
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import time
from collections.abc import Collection
from pathlib import Path

import httpx

from grid.identity.authority import Authority
from grid.identity.server import SecuredClusterNode
from grid.identity.tls import TLSMaterial
from grid.transport.cluster import NodeAddress, new_route_secret
from grid.transport.embedded import find_nats_server

PREFIX = "gridc"
BRIDGE = f"{PREFIX}-br0"
SUBNET_PREFIX = "10.214.0"
BRIDGE_ADDRESS = f"{SUBNET_PREFIX}.1"
# Every node has its own namespace, so all use the usual ports.
CLIENT_PORT, ROUTE_PORT, MONITOR_PORT = 4222, 6222, 8222


class NamespaceClusterError(RuntimeError):
    """A namespace, link or traffic filter could not be made or removed; the message says which."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = shutil.which(argv[0])
    if binary is None:
        raise NamespaceClusterError(f"`{argv[0]}` (iproute2) is not installed")
    done = subprocess.run([binary, *argv[1:]], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NamespaceClusterError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


class NamespacedNode(SecuredClusterNode):
    """A secured cluster node launched inside its own namespace, on the usual ports."""

    def spawn(self) -> None:
        # The usual port probe binds in this process's namespace, where the node's address does
        # not exist; in the node's own fresh namespace every port is free.
        assert self.binary is not None and self.requested_port is not None
        self.port, self.monitor_port = self.requested_port, self.requested_monitor_port or MONITOR_PORT
        self._launch(self.binary)


class NodeNetwork:
    """A bridge in this namespace and one namespace per node on it, with its own address.

    `make()`, then always `remove()` (in `finally`): it removes exactly what `make` made."""

    def __init__(self, nodes: int = 3) -> None:
        self.count = nodes
        self.namespaces = [f"{PREFIX}-n{i + 1}" for i in range(nodes)]
        self.links = [(f"{PREFIX}-v{i + 1}", f"{PREFIX}-p{i + 1}") for i in range(nodes)]  # (bridge, inside)
        self.addresses = [f"{SUBNET_PREFIX}.{11 + i}" for i in range(nodes)]
        self.silent: set[int] = set()
        self._made: list[tuple[str, str]] = []  # ("netns" | "link", name), in the order made

    def make(self) -> "NodeNetwork":
        if _run("ip", "link", "show", BRIDGE, check=False).returncode == 0:
            raise NamespaceClusterError(f"the bridge {BRIDGE} already exists: another namespaced cluster runs, "
                                        f"or one was left behind (`ip link del {BRIDGE}`)")
        try:
            _run("ip", "link", "add", BRIDGE, "type", "bridge")
            self._made.append(("link", BRIDGE))
            _run("ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
            _run("ip", "link", "set", BRIDGE, "up")
            for ns, (outer, inner), address in zip(self.namespaces, self.links, self.addresses, strict=True):
                _run("ip", "netns", "add", ns)
                self._made.append(("netns", ns))
                _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
                self._made.append(("link", outer))
                _run("ip", "link", "set", inner, "netns", ns)
                _run("ip", "link", "set", outer, "master", BRIDGE)
                _run("ip", "link", "set", outer, "up")
                _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", inner)
                _run("ip", "-n", ns, "link", "set", inner, "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise
        return self

    def exec_prefix(self, index: int) -> list[str]:
        """The argv prefix that runs a command inside node `index`'s namespace."""
        return [shutil.which("ip") or "ip", "netns", "exec", self.namespaces[index]]

    def silence(self, index: int) -> None:
        """Drop every packet into and out of node `index`'s namespace; its processes run on.

        Its only link goes down inside the namespace: no reset, no FIN, its sockets stay open,
        and nothing reaches it or leaves it (this kernel has no tc drop action, and the image
        no nft/iptables; a pulled cable is the same fault)."""
        _run("ip", "-n", self.namespaces[index], "link", "set", self.links[index][1], "down")
        self.silent.add(index)

    def unsilence(self, index: int) -> None:
        _run("ip", "-n", self.namespaces[index], "link", "set", self.links[index][1], "up")
        self.silent.discard(index)

    def remove(self) -> list[str]:
        """Remove what `make` made; returns what could not be removed."""
        problems = []
        for kind, name in reversed(self._made):
            if not name.startswith(PREFIX):
                continue
            argv = ("ip", "netns", "del", name) if kind == "netns" else ("ip", "link", "del", name)
            done = _run(*argv, check=False)
            if done.returncode != 0 and "Cannot find" not in done.stderr and "No such" not in done.stderr:
                problems.append(f"{kind} {name}: {done.stderr.strip()}")
        self._made.clear()
        return problems


class NamespacedTLSCluster:
    """Start with `start()`, always `stop()` (in `finally`): it stops the nodes and removes the
    namespaces, links and bridge it made."""

    def __init__(self, base_dir: Path, authority: Authority, *, nodes: int = 3, name: str = "gridc") -> None:
        self.base_dir = Path(base_dir)
        self.authority = authority
        self.name = name
        self.count = nodes
        self.network = NodeNetwork(nodes)
        self.addresses = self.network.addresses
        self.tls = TLSMaterial(self.base_dir / "tls")
        self.nodes: list[NamespacedNode] = []

    @property
    def urls(self) -> list[str]:
        return [f"tls://{a}:{CLIENT_PORT}" for a in self.addresses]

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    @property
    def ca_cert(self) -> Path:
        return self.tls.ca_cert

    def start(self) -> "NamespacedTLSCluster":
        self.network.make()
        try:
            self._start_nodes()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_nodes(self) -> None:
        self.tls.ensure(self.addresses, now=dt.datetime.now(dt.timezone.utc))
        peers = [NodeAddress(f"{self.name}-n{i + 1}", a, CLIENT_PORT, ROUTE_PORT) for i, a in enumerate(self.addresses)]
        secret = new_route_secret()
        server = find_nats_server()
        for i, me in enumerate(peers):
            store = self.base_dir / me.name
            store.mkdir(parents=True, exist_ok=True)
            # The node's own launcher, run inside its namespace (exec keeps the pid: signals and
            # wait() reach nats-server itself).
            launcher = store / "nats-server-in-netns"
            launcher.write_text(f"#!/bin/sh\nexec {' '.join(self.network.exec_prefix(i))} {server} \"$@\"\n")
            launcher.chmod(0o700)
            self.nodes.append(NamespacedNode(store, authority=self.authority, tls=self.tls, cluster=self.name,
                                             me=me, nodes=peers, route_secret=secret, sync_always=True,
                                             monitor_port=MONITOR_PORT, binary=launcher))
        for node in self.nodes:
            node.spawn()
        for node in self.nodes:
            node.wait_ready()
        wait_healthy(self.addresses, exclude=self.network.silent)

    def index_of(self, server_name: str) -> int:
        return [n.server_name for n in self.nodes].index(server_name)

    def silence(self, index: int) -> None:
        self.network.silence(index)

    def unsilence(self, index: int) -> None:
        self.network.unsilence(index)

    def stop(self) -> list[str]:
        """Stop every node, then remove the network; returns what could not be removed."""
        for i in list(self.network.silent):
            self.unsilence(i)  # a silent node still stops on SIGTERM, but its peers then wait on it
        for node in self.nodes:
            node.stop()
        return self.network.remove()


def wait_healthy(addresses: list[str], *, exclude: Collection[int] = (), timeout: float = 30.0) -> None:
    """Until every node (but `exclude`) reports JetStream healthy, meta leader included."""
    deadline = time.monotonic() + timeout
    pending = [i for i in range(len(addresses)) if i not in exclude]
    while pending:
        url = f"http://{addresses[pending[0]]}:{MONITOR_PORT}/healthz"
        try:
            ok = httpx.get(url, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            pending.pop(0)
        elif time.monotonic() > deadline:
            raise NamespaceClusterError(f"nodes {pending} did not report JetStream healthy within {timeout}s")
        else:
            time.sleep(0.1)
