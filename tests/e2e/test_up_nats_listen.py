"""`gridctl up --nats-listen` opens its embedded NATS to another machine, over TLS, with no
hand-written server config: real processes in two network namespaces this test creates.

Namespace A runs `gridctl up --nats-listen A:PORT` (embedded nats-server with auth and TLS from
Grid's private CA, controller, gateway, local agent, llama.cpp). Namespace B, which can reach A
only over the veth pair between them, joins with a `gridctl invite` token (which pins the
server's certificate; the join reply hands over the CA) and runs `gridctl node start`; its
engine serves chats that A's gateway routes to it over NATS.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID
from grid.identity.invitations import JoinToken

pytestmark = pytest.mark.e2e

GRIDCTL = [sys.executable, "-m", "grid.cli.main"]
JOINER = "remote-1"
# A /30 of our own between the two namespaces; names carry the pid so concurrent sessions differ.
ADDRESS_A, ADDRESS_B, PREFIX_LEN = "10.214.77.1", "10.214.77.2", 30
TAG = f"gl{os.getpid() % 100000}"
NS_A, NS_B = f"{TAG}a", f"{TAG}b"
VETH_A, VETH_B = f"{TAG}va", f"{TAG}vb"
NATS_PORT = 4222  # inside namespace A: nothing else listens there


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr}"


def _make_namespaces() -> None:
    _ip("netns", "add", NS_A)
    _ip("netns", "add", NS_B)
    _ip("link", "add", VETH_A, "netns", NS_A, "type", "veth", "peer", "name", VETH_B, "netns", NS_B)
    for ns, dev, address in ((NS_A, VETH_A, ADDRESS_A), (NS_B, VETH_B, ADDRESS_B)):
        _ip("-n", ns, "addr", "add", f"{address}/{PREFIX_LEN}", "dev", dev)
        _ip("-n", ns, "link", "set", dev, "up")
        _ip("-n", ns, "link", "set", "lo", "up")


def _remove_namespaces() -> None:
    # Deleting a namespace deletes the veth end in it, and so the pair.
    for ns in (NS_A, NS_B):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _in(ns: str) -> list[str]:
    return ["ip", "netns", "exec", ns]


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    for name in ("GRID_NATS_URL", "GRID_AGENT_STATE_DIR", "GRID_LOG_BUDGET"):
        env.pop(name, None)
    return env


def _wait_for_text(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text(errors="replace")
        if text in content:
            return content
        assert proc.poll() is None, f"exited with {proc.returncode}:\n{content[-3000:]}"
        time.sleep(0.3)
    raise AssertionError(f"{text!r} not printed within {timeout}s:\n{path.read_text(errors='replace')[-3000:]}")


@dataclass
class TwoMachines:
    env_a: dict[str, str]
    env_b: dict[str, str]
    up_log: Path
    agent_log: Path
    token: dict

    def gridctl_a(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*_in(NS_A), *GRIDCTL, *args], env=self.env_a, capture_output=True, text=True,
                              timeout=timeout)

    def status(self) -> dict:
        done = self.gridctl_a("status", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


@pytest.fixture
def two_machines(tmp_path: Path, bundled_model_home: Path, engine_runtime: object) -> Iterator[TwoMachines]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    for home in (home_a, home_b):
        home.mkdir()
        (home / "artifacts").symlink_to(bundled_model_home / "artifacts")  # no second download
    env_a, env_b = _env(home_a), _env(home_b)
    up_log, agent_log = tmp_path / "up.log", tmp_path / "agent.log"
    up = agent = None
    _make_namespaces()
    try:
        with open(up_log, "w") as out:
            up = subprocess.Popen([*_in(NS_A), *GRIDCTL, "up", "--port", "0", "--no-dashboard",
                                   "--nats-listen", f"{ADDRESS_A}:{NATS_PORT}"],
                                  env=env_a, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _wait_for_text(up_log, "ready:", up, 180)
        invited = subprocess.run([*_in(NS_A), *GRIDCTL, "invite", "--host-id", JOINER, "--ttl", "10m",
                                  "--failure-domain", "remote", "--server", f"tls://{ADDRESS_A}:{NATS_PORT}", "--json"],
                                 env=env_a, capture_output=True, text=True, timeout=60)
        assert invited.returncode == 0, invited.stderr
        token = json.loads(invited.stdout)
        joined = subprocess.run([*_in(NS_B), *GRIDCTL, "node", "join", token["token"]], env=env_b,
                                capture_output=True, text=True, timeout=60)
        assert joined.returncode == 0, joined.stdout + joined.stderr
        with open(agent_log, "w") as out:
            agent = subprocess.Popen([*_in(NS_B), *GRIDCTL, "node", "start", "--heartbeat-interval", "0.5"],
                                     env=env_b, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _wait_for_text(agent_log, f"agent {JOINER} running", agent, 60)
        yield TwoMachines(env_a, env_b, up_log, agent_log, token)
    finally:
        try:
            if agent is not None and agent.poll() is None:
                agent.terminate()
                agent.wait(90)
            if up is not None and up.poll() is None:
                subprocess.run([*_in(NS_A), *GRIDCTL, "down"], env=env_a, capture_output=True, timeout=120)
                up.wait(60)
        finally:
            for proc in (agent, up):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
            _remove_namespaces()


def _chat_hosts(machines: TwoMachines, attempts: int) -> list[tuple[int, str | None]]:
    """Chats through A's gateway (inside namespace A), each with its own affinity key."""
    script = (
        "import httpx, json, sys\n"
        f"gateway, n = sys.argv[1], int(sys.argv[2])\n"
        "out = []\n"
        "for i in range(n):\n"
        f"    body = {{'model': {BUNDLED_MODEL_ID!r}, 'messages': [{{'role': 'user', 'content': 'Say hi.'}}],"
        " 'max_tokens': 2}\n"
        "    r = httpx.post(gateway + '/v1/chat/completions', json=body, timeout=60,\n"
        "                   headers={'X-Grid-Affinity-Key': f'session-{i}'})\n"
        "    out.append((r.status_code, r.headers.get('x-grid-host')))\n"
        "print(json.dumps(out))\n"
    )
    gateway = next(line.split()[1] for line in machines.up_log.read_text().splitlines()
                   if line.strip().startswith("gateway ")).removesuffix("/v1")
    done = subprocess.run([*_in(NS_A), sys.executable, "-c", script, gateway, str(attempts)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return [tuple(x) for x in json.loads(done.stdout)]  # type: ignore[misc]


def test_a_machine_in_another_namespace_joins_over_tls_and_serves(two_machines: TwoMachines) -> None:
    m = two_machines
    token = JoinToken.decode(m.token["token"])
    assert token.servers == (f"tls://{ADDRESS_A}:{NATS_PORT}",)
    assert token.tls_fingerprint is not None and token.tls_fingerprint.startswith("sha256:")
    assert "other machines  tls://" in m.up_log.read_text()

    # B heartbeats through A's TLS listener: the controller sees it fresh.
    deadline = time.monotonic() + 60
    while not any(h["host_id"] == JOINER and h["fresh"] for h in m.status()["hosts"]):
        assert time.monotonic() < deadline, f"{JOINER} never fresh:\n{m.agent_log.read_text()[-3000:]}"
        time.sleep(1.0)

    # Two replicas: one on each machine; then B's engine answers chats routed to it over NATS.
    set_ = m.gridctl_a("model", "set", BUNDLED_MODEL_ID, "--min-replicas", "2", "--max-replicas", "2")
    assert set_.returncode == 0, set_.stderr
    deadline = time.monotonic() + 240
    while True:
        hosts = {h["host_id"]: h for h in m.status()["hosts"]}
        states = [r["state"] for r in hosts.get(JOINER, {}).get("residencies", ())]
        if "ready" in states:
            break
        assert time.monotonic() < deadline, f"no ready replica on {JOINER}: {states}\n{m.agent_log.read_text()[-3000:]}"
        time.sleep(2.0)
    # The gateway routes to B once its own view of the log has B's replica ready, which may
    # follow the controller's status by a heartbeat: ask again (every chat must succeed) until
    # one of the affinity keys lands on B.
    deadline = time.monotonic() + 60
    while True:
        served = _chat_hosts(m, 16)
        assert all(code == 200 for code, _ in served), served
        if JOINER in {host for _, host in served}:
            break
        assert time.monotonic() < deadline, f"no chat routed to {JOINER}: {served}"
        time.sleep(1.0)

    # The listener speaks TLS only: a plain client is refused before it can say anything.
    plain = subprocess.run([*_in(NS_B), sys.executable, "-c",
                            "import asyncio, nats\n"
                            "async def main():\n"
                            f"    await nats.connect('nats://{ADDRESS_A}:{NATS_PORT}', allow_reconnect=False,"
                            " connect_timeout=3)\n"
                            "asyncio.run(main())\n"], capture_output=True, text=True, timeout=60)
    assert plain.returncode != 0
