"""Real 3-node nats-server clusters on loopback ports, one per test (nodes get killed here).

Each node is its own process with its own JetStream store; routes carry the route secret. The
fixtures stop every node in `finally`, including nodes a test paused with SIGSTOP.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from grid.identity.authority import Authority
from grid.identity.server import SecuredNatsCluster
from grid.identity.tls import TLSMaterial
from grid.transport.cluster import NatsCluster


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    cluster = NatsCluster(tmp_path / "cluster", nodes=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def authority(tmp_path: Path) -> Authority:
    return Authority(tmp_path / "identity")


@pytest.fixture
def cluster_tls(tmp_path: Path) -> TLSMaterial:
    return TLSMaterial(tmp_path / "tls").ensure(["127.0.0.1"], now=dt.datetime.now(dt.timezone.utc))


@pytest.fixture
def secured_cluster(tmp_path: Path, authority: Authority, cluster_tls: TLSMaterial) -> Iterator[SecuredNatsCluster]:
    cluster = SecuredNatsCluster(tmp_path / "secured-cluster", authority, tls=cluster_tls, nodes=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()

