"""`gridctl nats cluster-config` writes configs that real nats-servers run as a secured cluster;
routes admit only nodes that hold the route secret."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest

from grid.events.log import LogError
from grid.identity.connect import connect_log
from grid.transport import cluster as cluster_module
from grid.transport.cluster import NatsCluster
from grid.transport.embedded import find_nats_server
from grid.transport.jetstream import JetStreamLog
from tests.ports import port_block


def gridctl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRID_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "grid.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=120)


class Servers:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, config: Path, log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen([str(find_nats_server()), "-c", str(config)], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


@pytest.fixture
def servers() -> Iterator[Servers]:
    s = Servers()
    try:
        yield s
    finally:
        s.stop()


def wait_healthy(monitor_ports: list[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    for port in monitor_ports:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"node with monitor port {port} never became healthy"
            time.sleep(0.1)


async def test_cluster_config_runs_as_a_secured_r3_cluster(tmp_path: Path, servers: Servers) -> None:
    """Written under --output with paths for --config-dir (where the README copies each node's
    directory on its machine): nothing is written at --config-dir, and the copies run."""
    home = tmp_path / "home"
    base = port_block(9)
    out = tmp_path / "nodes"
    machines = tmp_path / "machines"  # stands for /etc/nats on each node's machine
    proc = gridctl(home, "nats", "cluster-config", "--nodes", "3", "--name", "testgrid", "--host", "127.0.0.1",
                   "--client-port", str(base), "--route-port", str(base + 3), "--monitor-port", str(base + 6),
                   "--output", str(out), "--config-dir", str(machines), "--json")
    assert proc.returncode == 0, proc.stderr
    assert not machines.exists()
    doc = json.loads(proc.stdout)
    assert [n["name"] for n in doc["nodes"]] == ["testgrid-n1", "testgrid-n2", "testgrid-n3"]
    url = doc["nats_url"]
    assert url == f"tls://127.0.0.1:{base},tls://127.0.0.1:{base + 1},tls://127.0.0.1:{base + 2}"
    for node in doc["nodes"]:
        config = Path(node["config"])
        assert config.stat().st_mode & 0o077 == 0  # the route secret and keys are owner-only
        assert str(out) not in config.read_text()  # every path points where it will be
        there = machines / node["name"]
        shutil.copytree(config.parent, there)
        servers.start(there / config.name, tmp_path / f"{node['name']}.log")
    wait_healthy([base + 6, base + 7, base + 8])
    creds = home / "identity" / "creds" / "controller.creds"
    ca = home / "identity" / "tls" / "ca.pem"
    log = await connect_log(url, credentials=creds, tls_ca=ca, name="test-controller")
    try:
        assert log.clustered()
        assert {r.actual for r in log.replica_reports} == {3}
        await log.append_raw("grid.ctl.tick", b"{}", msg_id="on-the-cluster")
        # Every node fsyncs each write and cluster-config recorded them: trusted as durable,
        # though the controller's credential may not ask a server its sync policy.
        from grid.identity.durability import external_log_durable

        durable, reported, recorded = await external_log_durable(log, home)
        assert (durable, reported) == (True, None) and recorded in {n["name"] for n in doc["nodes"]}
    finally:
        await log.close()
    # Operator mode on every node: no credential, no connection.
    with pytest.raises(LogError, match="(?i)authorization"):
        await JetStreamLog.connect(f"tls://127.0.0.1:{base + 1}", nats_options=_tls(ca),
                                   ensure_streams=False)


def _tls(ca: Path) -> dict[str, object]:
    from grid.identity.creds import client_tls_context

    return {"tls": client_tls_context(ca)}


def test_cluster_config_refuses_layouts_it_cannot_secure(tmp_path: Path) -> None:
    home = tmp_path / "home"
    two_hosts = gridctl(home, "nats", "cluster-config", "--nodes", "3", "--host", "a", "--host", "b")
    assert two_hosts.returncode == 1 and "--nodes 3 needs 3 --host values" in two_hosts.stderr
    open_wire = gridctl(home, "nats", "cluster-config", "--nodes", "3", "--host", "a", "--host", "b",
                        "--host", "c", "--no-tls")
    assert open_wire.returncode == 1 and "needs TLS" in open_wire.stderr
    bad_name = gridctl(home, "nats", "cluster-config", "--name", "a b", "--host", "127.0.0.1")
    assert bad_name.returncode == 1 and "not a usable NATS server or cluster name" in bad_name.stderr


@pytest.mark.parametrize("credentials", ["", "grid-route:wrong-password@"])
async def test_a_node_without_the_route_secret_cannot_join(tmp_path: Path, servers: Servers,
                                                          nats_cluster: NatsCluster, credentials: str) -> None:
    target = nats_cluster.addresses[0]
    port = port_block(3)
    route, monitor = port + 1, port + 2
    config = tmp_path / "rogue.conf"
    config.write_text(
        f"server_name: rogue\nlisten: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor}\n"
        f"jetstream {{ store_dir: \"{tmp_path / 'rogue'}\" }}\n"
        f"cluster {{\n  name: {nats_cluster.name}\n  listen: 127.0.0.1:{route}\n"
        f"  routes: [\"nats-route://{credentials}{target.host}:{target.route_port}\"]\n}}\n"
    )
    servers.start(config, tmp_path / "rogue.log")
    time.sleep(3.0)  # several route attempts
    routez = httpx.get(f"http://127.0.0.1:{monitor}/routez", timeout=2.0).json()
    assert routez["num_routes"] == 0
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        assert len(set(nc._server_info.get("connect_urls") or [])) <= 1  # alone, not part of the cluster
    finally:
        await nc.close()
    log = (tmp_path / "rogue.log").read_text()
    assert "Authorization Violation" in log or "authorization" in log.lower()


def test_a_cluster_whose_picked_port_was_taken_meanwhile_starts_on_new_ports(
        tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # The fourth pick, the second node's route port, is bound by another process after the pick
    # and before that node starts: the race free ports always have.
    picks = itertools.count()
    pick = cluster_module.free_port
    monkeypatch.setattr(cluster_module, "free_port", lambda host: taken_port if next(picks) == 3 else pick(host))
    cluster = NatsCluster(tmp_path / "cluster", nodes=3)
    assert cluster.addresses[1].route_port == taken_port
    with cluster:
        assert taken_port not in {p for a in cluster.addresses for p in (a.client_port, a.route_port)}
        assert "address already in use" in cluster.nodes[1].log_path.read_text()
        for node in cluster.nodes:
            routez = httpx.get(f"http://127.0.0.1:{node.monitor_port}/routez", timeout=2.0).json()
            peers = {r.get("remote_name") for r in routez["routes"]}
            assert peers == {a.name for a in cluster.addresses} - {node.server_name}
