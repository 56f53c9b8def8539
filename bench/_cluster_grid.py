"""The grid the README's "Scale out" section tells users to run, as real processes, for benches.

`gridctl nats cluster-config --nodes 3` for three hosts (each a network namespace of its own,
grid.testfleet.nscluster), `nats-server -c grid-nN/nats.conf` on each, `gridctl serve
controller` and `gridctl serve gateway` given the three TLS URLs, and agents that joined by
invitation (`gridctl node start --join-token-file`) with the default runtime (xllamacpp's
server) and the bundled SmolLM2 GGUF. The controller, gateway and agents run in this namespace
(the operator's and users' side of the network); nodes can be killed or silenced.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256, ensure_bundled_model
from grid.config import GridConfig
from grid.testfleet.nscluster import CLIENT_PORT, MONITOR_PORT, NodeNetwork
from grid.transport.embedded import find_nats_server, free_port

GRIDCTL = [sys.executable, "-m", "grid.cli.main"]
MODEL = BUNDLED_MODEL_ID
CACHE = Path(os.environ.get("GRID_BENCH_CACHE", Path.home() / ".cache" / "grid-bench"))


def wait(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - not up yet
            value = None
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"{what}: not within {timeout}s")


class ClusterGrid:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.home = base / "grid"  # the operator's GRID_HOME: authority, controller and gateway
        self.network = NodeNetwork(3)
        self.nodes: list[subprocess.Popen[bytes] | None] = [None, None, None]
        self.configs: list[Path] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.url = ""
        self.gateway_url = ""
        self.fingerprint = ""

    # -- processes --------------------------------------------------------------------------

    def env(self, home: Path) -> dict[str, str]:
        return {**{k: v for k, v in os.environ.items() if not k.startswith("GRID_")}, "GRID_HOME": str(home)}

    def gridctl(self, *args: str, home: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*GRIDCTL, *args], env=self.env(home or self.home), capture_output=True, text=True,
                              timeout=timeout)

    def spawn(self, name: str, *args: str, home: Path | None = None) -> subprocess.Popen[bytes]:
        home = home or self.home
        home.mkdir(parents=True, exist_ok=True)
        with open(self.base / f"{name}.log", "ab") as out:
            p = subprocess.Popen([*GRIDCTL, *args], env=self.env(home), stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[name] = p
        return p

    def kill(self, name: str) -> None:
        p = self.procs.pop(name)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)

    # -- NATS nodes -------------------------------------------------------------------------

    def start_nats(self) -> None:
        self.network.make()
        hosts = [a for address in self.network.addresses for a in ("--host", address)]
        made = self.gridctl("nats", "cluster-config", "--nodes", "3", "--name", "grid", *hosts,
                            "--output", str(self.base / "nodes"), "--json")
        if made.returncode != 0:
            raise SystemExit(f"gridctl nats cluster-config failed: {made.stderr}")
        doc = json.loads(made.stdout)
        self.url, self.fingerprint = doc["nats_url"], doc["tls_fingerprint"]
        self.configs = [Path(n["config"]) for n in doc["nodes"]]
        for i in range(3):
            self.start_node(i)
        for i in range(3):
            wait(lambda i=i: self.node_healthy(i), 60, f"NATS node {i + 1} healthy")

    def start_node(self, index: int) -> None:
        with open(self.base / f"nats-n{index + 1}.log", "ab") as out:
            self.nodes[index] = subprocess.Popen(
                [*self.network.exec_prefix(index), str(find_nats_server()), "-c", str(self.configs[index])],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def node_http(self, index: int, path: str) -> str:
        """GET on a node's monitoring port, which cluster-config binds to the node's loopback."""
        done = subprocess.run([*self.network.exec_prefix(index), shutil.which("curl") or "curl", "-sf", "-m", "2",
                               f"http://127.0.0.1:{MONITOR_PORT}{path}"], capture_output=True, text=True, timeout=10)
        return done.stdout if done.returncode == 0 else ""

    def node_healthy(self, index: int) -> bool:
        return '"ok"' in self.node_http(index, "/healthz")

    def node_of(self, connection_name: str) -> int | None:
        """The node a named client connection is on (its /connz)."""
        for i in range(3):
            if i in self.network.silent:
                continue
            text = self.node_http(i, "/connz?limit=1024")
            if text and any(c.get("name") == connection_name for c in json.loads(text).get("connections") or []):
                return i
        return None

    def kill_node(self, index: int) -> None:
        node = self.nodes[index]
        if node is not None and node.poll() is None:
            node.kill()
            node.wait(10)

    def restart_node(self, index: int) -> None:
        self.start_node(index)
        wait(lambda: self.node_healthy(index), 60, f"NATS node {index + 1} healthy again")

    # -- the grid ---------------------------------------------------------------------------

    def start_grid(self, agents: int = 1, agent_memory_mb: int = 4000) -> None:
        """The controller (automatic mode), the gateway, `agents` agents, and the bundled model
        with one replica; returns once the gateway answers a chat."""
        self.spawn("controller", "serve", "controller", "--nats", self.url, "--port", "0", "--no-analytics",
                   "--tick-interval", "1", "--log-format", "json")
        wait(lambda: self.gridctl("status", "--json").returncode == 0, 90, "the controller answers")
        if self.gridctl("mode", "automatic").returncode != 0:
            raise SystemExit("gridctl mode automatic failed")
        ensure_bundled_model(GridConfig(home=CACHE, nats_url=None))
        for n in range(1, agents + 1):
            self.start_agent(f"a{n}", agent_memory_mb, n)
        set_model = self.gridctl("model", "set", MODEL, "--memory-mb", "512", "--artifact-sha256", BUNDLED_SHA256,
                                 "--min-replicas", "1", "--max-replicas", "1")
        if set_model.returncode != 0:
            raise SystemExit(f"gridctl model set failed: {set_model.stderr}")
        port = free_port()
        self.gateway_url = f"http://127.0.0.1:{port}"
        self.spawn("gateway", "serve", "gateway", "--nats", self.url, "--port", str(port), "--log-format", "json")
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        wait(lambda: httpx.post(f"{self.gateway_url}/v1/chat/completions", json=body, timeout=30).status_code == 200,
             300, "the gateway answers a chat")

    def start_agent(self, host_id: str, memory_mb: int, n: int) -> None:
        from grid.identity.admin import invite
        from grid.secrets import write_owner_only

        home = self.base / host_id
        home.mkdir(parents=True, exist_ok=True)
        if not (home / "artifacts").exists():
            (home / "artifacts").symlink_to(CACHE / "artifacts")
        _, token = invite(self.home, tuple(self.url.split(",")), host_id=host_id, now=time.time(), ttl_seconds=600,
                          failure_domain=f"fd-{host_id}", tls_fingerprint=self.fingerprint)
        write_owner_only(home / "join.token", (token + "\n").encode())
        lo = 39000 + 50 * n
        self.spawn(f"agent-{host_id}", "node", "start", "--join-token-file", str(home / "join.token"),
                   "--nats", self.url, "--memory-mb", str(memory_mb), "--port-range", f"{lo}-{lo + 49}",
                   "--heartbeat-interval", "0.5", "--engine-threads", "1", "--log-format", "json", home=home)

    def stop(self) -> None:
        for i in list(self.network.silent):
            self.network.unsilence(i)
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        # Engines run in their own session (an agent's successor adopts them): end what is left.
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(str(self.base) in arg for arg in proc.info["cmdline"] or ()):
                    proc.kill()
        for node in self.nodes:
            if node is not None and node.poll() is None:
                node.terminate()
                try:
                    node.wait(10)
                except subprocess.TimeoutExpired:
                    node.kill()
        problems = self.network.remove()
        if problems:
            print(f"could not remove: {problems}", file=sys.stderr)


@contextlib.contextmanager
def cluster_grid(base: Path, *, agents: int = 1) -> Iterator[ClusterGrid]:
    grid = ClusterGrid(base)
    try:
        grid.start_nats()
        grid.start_grid(agents=agents)
        yield grid
    finally:
        grid.stop()


__all__ = ["CLIENT_PORT", "ClusterGrid", "MODEL", "cluster_grid", "wait"]
