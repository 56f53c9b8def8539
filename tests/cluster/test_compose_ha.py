"""docker-compose.yml's default stack: 3 NATS nodes, 2 controllers, 2 gateways, an agent, each
running a real command (no Docker engine here: the commands are parsed by gridctl itself and
the node configs that `identity-ha` writes pass nats-server's own check)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from grid.transport.embedded import find_nats_server
from tests.unit.test_compose import ROOT, resolve

HA = ("identity-ha", "nats-1", "nats-2", "nats-3", "controller-a", "controller-b", "invite-ha",
      "gateway-a", "gateway-b", "agent-ha")
CLUSTER_URL = "tls://nats-1:4222,tls://nats-2:4222,tls://nats-3:4222"


def services() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def test_the_default_stack_has_the_cluster_topology_with_real_commands() -> None:
    s = services()
    assert set(HA) <= set(s)
    assert all(not s[name].get("profiles") for name in HA)
    # The single-node services are the `single` profile.
    assert all(s[name].get("profiles") == ["single"] for name in ("nats", "controller", "gateway", "agent"))
    for name in HA:
        if name.startswith("nats-"):
            continue
        ctx = resolve(s[name]["command"][1:])
        if name in ("controller-a", "controller-b", "gateway-a", "gateway-b", "agent-ha"):
            assert ctx.params["nats"] == CLUSTER_URL, name
            assert s[name]["restart"] == "unless-stopped" and "healthcheck" in s[name], name
    assert resolve(s["controller-a"]["command"][1:]).params["replicas"] == "3"
    # Two controllers: each its own home (its lock), one shared authority.
    a = {v.split(":")[1]: v.split(":")[0] for v in s["controller-a"]["volumes"]}
    b = {v.split(":")[1]: v.split(":")[0] for v in s["controller-b"]["volumes"]}
    assert a["/grid"] != b["/grid"] and a["/grid/identity"] == b["/grid/identity"]
    # Two gateways on different published ports.
    assert s["gateway-a"]["ports"] != s["gateway-b"]["ports"]
    # No NATS port is published; each node has its own store volume.
    stores = set()
    for i in (1, 2, 3):
        node = s[f"nats-{i}"]
        assert "ports" not in node
        assert node["command"] == ["-c", f"/etc/nats/cluster/grid-n{i}/nats.conf"]
        stores |= {v.split(":")[0] for v in node["volumes"] if v.endswith(":/data")}
    assert len(stores) == 3


def test_identity_ha_writes_node_configs_nats_server_accepts(tmp_path: Path) -> None:
    command = services()["identity-ha"]["command"]
    mounts = {"/etc/nats/cluster": tmp_path / "etc", "/data": tmp_path / "data", "/gateway": tmp_path / "gateway"}
    args = []
    for arg in command[1:]:
        for target, path in mounts.items():
            if arg == target or arg.startswith(target + "/"):
                arg = str(path) + arg[len(target):]
        args.append(arg)
    env = {**os.environ, "GRID_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "grid.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    for i in (1, 2, 3):
        conf = tmp_path / "etc" / f"grid-n{i}" / "nats.conf"
        text = conf.read_text()
        assert "listen: 0.0.0.0:4222" in text and "http: 127.0.0.1:8222" in text
        assert "nats-route://grid-route:" in text and "verify: true" in text
        assert "nats-1:6222" in text or i == 1
        check = subprocess.run([str(find_nats_server()), "-c", str(conf), "-t"], capture_output=True, text=True,
                               timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr
    gateway_files = sorted(p.relative_to(tmp_path / "gateway").as_posix()
                           for p in (tmp_path / "gateway").rglob("*") if p.is_file())
    assert gateway_files == ["identity/creds/gateway.creds", "identity/tls/ca.pem"]
