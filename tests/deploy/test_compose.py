"""docker-compose.yml for real, as an operator runs it: podman builds the image (from the base
deploy/podman/base-image.sh makes from Debian packages, no registry) and podman-compose brings the
stack up from nothing: three NATS nodes with TLS, two controllers, two gateways behind the TLS
proxy, an agent that joins by invitation and serves the bundled SmolLM2 model on a real llama.cpp
engine. The README's one command (`podman-compose --profile ask run --rm first-answer`) gives the
first answer; a client with a key gets answers through the proxy, and still does once the active
controller and the NATS metadata leader are killed. Everything is torn down at the end.

Run: `deploy/podman/setup.sh` (root, once), then
`GRID_DEPLOY_TESTS=1 python -m pytest -n 0 -s tests/deploy` (.ci/run does both after the main suite).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID
from grid.transport.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
PODMAN_DIR = ROOT / "deploy" / "podman"
PROJECT = "grid-deploy-test"
IMAGE = "grid-allocator:local"
# podman-compose older than this ignores `profiles` (it would start the `single` and `ask` services).
MIN_PODMAN_COMPOSE = (1, 1)
# Bounds: the first answer comes some 30 s after `up` here (the wheel's GGUF is pushed into the
# grid's R3 artifact store, fetched by the agent, loaded); a standby takes the lease after one
# lease TTL (15 s) and clients reconnect to the surviving NATS nodes within seconds.
FIRST_ANSWER_SECONDS = 900
FAILOVER_SECONDS = 180

timings: dict[str, float] = {}


def say(text: str) -> None:
    print(f"[deploy] {text}", flush=True)


def podman_compose_command() -> list[str]:
    """podman-compose from GRID_PODMAN_COMPOSE, this interpreter's environment or PATH, new enough."""
    candidates = [os.environ.get("GRID_PODMAN_COMPOSE"), str(Path(sys.executable).parent / "podman-compose"),
                  shutil.which("podman-compose")]
    found = next((c for c in candidates if c and Path(c).is_file()), None)
    if found is None:
        pytest.fail("podman-compose is not installed: deploy/podman/setup.sh installs it (deploy/podman/requirements.txt)")
    out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60).stdout
    match = re.search(r"podman-compose version (\d+)\.(\d+)", out)
    version = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    if version < MIN_PODMAN_COMPOSE:
        pytest.fail(f"{found} is podman-compose {out.strip()!r}; docker-compose.yml needs profiles (1.1 or later): "
                    "deploy/podman/setup.sh installs deploy/podman/requirements.txt's")
    return [found]


def check_machine() -> None:
    if os.geteuid() != 0:
        pytest.fail("the deploy test runs podman as root (deploy/podman/setup.sh)")
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: run deploy/podman/setup.sh (apt-get install podman runc debootstrap)")


class Stack:
    """The compose project, driven through podman-compose and podman."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.key = "sk-deploy-" + secrets.token_hex(12)
        self.https_port = free_port("0.0.0.0")
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(PODMAN_DIR / "containers.conf"),
            "GRID_GATEWAY_API_KEYS": self.key,
            "GRID_HTTPS_PORT": str(self.https_port),
            "GRID_ADMIN_PORT_A": str(free_port()),
            "GRID_ADMIN_PORT_B": str(free_port()),
            "GRID_GATEWAY_PORT_A": str(free_port()),
            "GRID_GATEWAY_PORT_B": str(free_port()),
        }
        self.compose = [*podman_compose_command(), "-p", PROJECT, "-f", str(ROOT / "docker-compose.yml")]

    def run(self, args: list[str], *, timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, cwd=ROOT)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def timed(self, label: str, args: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        done = self.run(args, timeout=timeout)
        timings[label] = time.monotonic() - started
        say(f"{label}: {timings[label]:.1f} s")
        return done

    def containers(self) -> dict[str, dict]:  # type: ignore[type-arg]
        """The project's containers by compose service."""
        out = self.run(["podman", "ps", "-a", "--format", "json", "--filter",
                        f"label=com.docker.compose.project={PROJECT}"], timeout=60).stdout
        return {c["Labels"]["com.docker.compose.service"]: c for c in json.loads(out or "[]")}

    def name(self, service: str) -> str:
        return str(self.containers()[service]["Names"][0])

    def exec(self, service: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.run(["podman", "exec", self.name(service), *args], timeout=timeout, check=False)

    def down(self) -> None:
        self.run([*self.compose, "down", "-v", "-t", "5"], timeout=600, check=False)

    def leftovers(self) -> list[str]:
        found = [f"container {n}" for n in self.containers()]
        volumes = self.run(["podman", "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"],
                           timeout=60).stdout.split()
        networks = [n for n in self.run(["podman", "network", "ls", "--format", "{{.Name}}"], timeout=60).stdout.split()
                    if n.startswith(PROJECT)]
        return found + [f"volume {v}" for v in volumes] + [f"network {n}" for n in networks]

    def dump_logs(self) -> None:
        for service, container in sorted(self.containers().items()):
            logs = self.run(["podman", "logs", "--tail", "40", container["Names"][0]], timeout=60, check=False)
            say(f"--- {service} ({container.get('State')}):\n{(logs.stdout + logs.stderr)[-4000:]}")

    # -- what a client and an operator see ------------------------------------------------------

    def tls_context(self) -> ssl.SSLContext:
        cert = self.exec("gateway-tls", "cat", "/tls/cert.pem")
        assert cert.returncode == 0 and "BEGIN CERTIFICATE" in cert.stdout, cert.stderr
        path = self.tmp / "gateway-tls.pem"
        path.write_text(cert.stdout)
        return ssl.create_default_context(cafile=str(path))

    def chat(self, tls: ssl.SSLContext, *, key: str | None = None) -> httpx.Response:
        body = {"model": BUNDLED_MODEL_ID, "max_tokens": 24,
                "messages": [{"role": "user", "content": "Name one colour."}]}
        headers = {"Authorization": f"Bearer {key or self.key}"}
        return httpx.post(f"https://127.0.0.1:{self.https_port}/v1/chat/completions", json=body, headers=headers,
                          verify=tls, trust_env=False, timeout=httpx.Timeout(10.0, read=120.0))

    def lease(self, service: str) -> dict | None:  # type: ignore[type-arg]
        """The controller's own view of the lease (its admin API on its loopback, its own token)."""
        done = self.exec(service, "gridctl", "status", "--json", "--admin", "http://127.0.0.1:8787")
        if done.returncode != 0:
            return None
        return dict(json.loads(done.stdout)["controller"]["lease"])

    def nats_meta_leader(self) -> str:
        """The service of the NATS node that leads the JetStream meta group."""
        probe = ("import json, urllib.request; "
                 "print(json.load(urllib.request.urlopen('http://127.0.0.1:8222/jsz'))['meta_cluster']['leader'])")
        for service in ("nats-1", "nats-2", "nats-3"):
            done = self.exec(service, "python3", "-c", probe)
            leader = done.stdout.strip()
            if done.returncode == 0 and re.fullmatch(r"grid-n[123]", leader):
                return f"nats-{leader[-1]}"
        raise AssertionError("no NATS node names a meta leader")


def wait_for(what: str, probe, timeout: float, interval: float = 2.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except (httpx.HTTPError, ssl.SSLError, ValueError, KeyError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    check_machine()
    s = Stack(tmp_path)
    s.down()  # a run interrupted before its teardown left these
    assert not s.leftovers(), s.leftovers()
    failed = True
    try:
        yield s
        failed = False
    finally:
        if failed or os.environ.get("GRID_DEPLOY_LOGS"):
            s.dump_logs()
        started = time.monotonic()
        s.down()
        timings["down -v"] = time.monotonic() - started
        say(f"down -v: {timings['down -v']:.1f} s; " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
        left = s.leftovers()
        assert not left, f"left behind after down -v: {left}"


@pytest.mark.timeout(2400)
def test_the_compose_stack_answers_through_tls_and_survives_a_controller_and_a_nats_node(stack: Stack) -> None:
    started = time.monotonic()
    # The base image from Debian packages (cached once built), then the grid image (compiles nothing).
    stack.timed("base image", ["bash", str(PODMAN_DIR / "base-image.sh")], timeout=1200)
    stack.timed("image build", ["podman", "build", "-t", IMAGE, str(ROOT)], timeout=1800)
    up = time.monotonic()
    stack.timed("up -d", [*stack.compose, "up", "-d"], timeout=900)

    # The README's one command: it waits for the model, then chats through the TLS proxy with a key.
    first = stack.timed("first-answer (run after up)",
                        [*stack.compose, "--profile", "ask", "run", "--rm", "-T", "first-answer"],
                        timeout=FIRST_ANSWER_SECONDS + 60)
    timings["up -> first answer"] = time.monotonic() - up
    say(f"first answer: {first.stdout.strip()!r}")
    assert first.stdout.startswith(f"{BUNDLED_MODEL_ID}: ") and len(first.stdout.strip()) > len(BUNDLED_MODEL_ID) + 2

    # A client on the host: TLS verified against the proxy's certificate, a key required.
    tls = stack.tls_context()
    answer = stack.chat(tls)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"].strip()
    assert stack.chat(tls, key="sk-not-a-client-key").status_code == 401
    # TLS only: plain HTTP on the published port gets the proxy's refusal, never a gateway.
    plain = httpx.get(f"http://127.0.0.1:{stack.https_port}/v1/models", trust_env=False, timeout=10)
    assert plain.status_code == 400 and "HTTPS" in plain.text, plain.text

    # Exactly one controller holds the lease.
    def holder() -> tuple[str, int] | None:
        leases = {s: stack.lease(s) for s in ("controller-a", "controller-b")}
        held = [(s, int(lease["term"])) for s, lease in leases.items() if lease and lease["state"] == "held"]
        return held[0] if len(held) == 1 else None

    active, term = wait_for("one controller holding the lease", holder, 120)
    standby = "controller-b" if active == "controller-a" else "controller-a"
    leader = stack.nats_meta_leader()
    say(f"killing {active} (lease term {term}) and {leader} (NATS meta leader)")
    killed = time.monotonic()
    stack.run(["podman", "kill", stack.name(active), stack.name(leader)], timeout=60)

    def answers() -> bool:
        response = stack.chat(tls)
        return response.status_code == 200 and bool(response.json()["choices"][0]["message"]["content"].strip())

    wait_for("an answer through the gateway after the kills", answers, FAILOVER_SECONDS)
    timings["kill -> answer"] = time.monotonic() - killed

    def taken_over() -> bool:
        lease = stack.lease(standby)
        return bool(lease and lease["state"] == "held" and int(lease["term"]) > term)

    wait_for(f"{standby} holding the lease", taken_over, FAILOVER_SECONDS)
    timings["kill -> standby holds the lease"] = time.monotonic() - killed
    # The answers came from the survivors: the killed containers stayed down.
    states = {s: c["State"] for s, c in stack.containers().items()}
    assert states[active] != "running" and states[leader] != "running", states
    assert answers()
    timings["test until teardown"] = time.monotonic() - started
