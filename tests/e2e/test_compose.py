"""docker-compose.yml's topology running: its services' own commands as local processes
against the server config `gridctl nats init` writes, on a real nats-server, and the compose file itself where a Docker
engine answers (through testcontainers, an optional part: skipped with a reason without it)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.ports import engine_ports_arg
from tests.unit.test_compose import ROOT, _compose


def test_the_nats_config_the_identity_service_writes_is_valid_and_durable(tmp_path: Path) -> None:
    """The identity service's own `gridctl nats init` writes the whole config the nats service runs:
    it passes the real nats-server's configuration check, fsyncs every write, keeps monitoring on
    loopback, stores JetStream in the nats-data volume, and is recorded as durable for the
    controller's home."""
    import subprocess
    import sys

    from grid.transport.embedded import find_nats_server

    local = _Local(tmp_path, _compose()["services"])
    init = subprocess.run([sys.executable, "-m", "grid.cli.main", *local.args("identity")],
                          env=local.env("identity"), capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    conf_path = local.nats_config()
    check = subprocess.run([str(find_nats_server()), "-c", str(conf_path), "-t"], capture_output=True,
                           text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    conf = conf_path.read_text()
    assert "sync_interval: always" in conf and f"http: 127.0.0.1:{local.monitor}" in conf
    assert f'store_dir: "{local.volume("nats-data") / "jetstream"}"' in conf, conf
    assert "include grid-nats.conf" in conf
    grid_dir = conf_path.parent
    snippet = (grid_dir / "grid-nats.conf").read_text()
    assert "operator:" in snippet and "tls {" in snippet and str(grid_dir / "server.key") in snippet
    durability = (local.mounts("controller")["/grid"] / "identity" / "nats-durability.json").read_text()
    assert "grid-" in durability and '"sync_always":true' in durability.replace(" ", "")
    # The gateway's home holds its credential and the CA, and nothing else.
    gateway_home = local.mounts("gateway")["/grid"]
    gateway_files = sorted(p.relative_to(gateway_home).as_posix() for p in gateway_home.rglob("*") if p.is_file())
    assert gateway_files == ["identity/creds/gateway.creds", "identity/tls/ca.pem"]


def docker_engine_answers() -> bool:
    from testcontainers.core.docker_client import DockerClient  # the caller made sure it imports

    try:
        DockerClient().client.ping()
    except Exception:  # noqa: BLE001 - no socket, no daemon, no permission: all mean "no engine"
        return False
    return True


def wait_for(probe, timeout: float = 600.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
            last = value
        except (httpx.HTTPError, ValueError) as exc:
            last = exc
        time.sleep(2.0)
    raise AssertionError(f"compose topology not ready within {timeout:.0f}s: {last!r}")


# Values for what the compose file requires from the operator (${VAR:?...}).
TEST_VALUES = {"GRID_GATEWAY_API_KEYS": "sk-compose-test"}


def test_compose_topology_comes_up_and_the_agent_registers(monkeypatch: pytest.MonkeyPatch) -> None:
    # One of the suite's few skips for a missing part: this workplace has no Docker engine, and
    # the same topology runs without Docker in the next test, `gridctl up` and the serve/node tests.
    pytest.importorskip("testcontainers.compose", reason="testcontainers is not installed (the dev extra has it)")
    if not docker_engine_answers():
        pytest.skip("no Docker engine answers here")
    from testcontainers.compose import DockerCompose

    monkeypatch.setenv("GRID_GATEWAY_API_KEYS", TEST_VALUES["GRID_GATEWAY_API_KEYS"])
    # The one-node services (profile `single`): the default stack is the cluster, which
    # tests/deploy/test_compose.py brings up for real under podman.
    with DockerCompose(ROOT, compose_file_name="docker-compose.yml", build=True, wait=False,
                       profiles=["single"]) as compose:
        gateway = f"http://{compose.get_service_host('gateway', 8080)}:{compose.get_service_port('gateway', 8080)}"
        admin = f"http://{compose.get_service_host('controller', 8787)}:{compose.get_service_port('controller', 8787)}"
        key = {"Authorization": f"Bearer {TEST_VALUES['GRID_GATEWAY_API_KEYS']}"}
        assert wait_for(lambda: httpx.get(f"{gateway}/v1/models", headers=key, timeout=5).status_code == 200)
        token = wait_for(lambda: compose.exec_in_container(["cat", "/grid/operator.token"], "controller")[0].strip())

        def registered_hosts() -> list[object]:
            resp = httpx.get(f"{admin}/allocator/status", headers={"X-Grid-Allocator-Token": token}, timeout=5)
            resp.raise_for_status()
            return list(resp.json()["hosts"])

        assert wait_for(registered_hosts), "the compose agent never registered with the controller"


class _Local:
    """The compose services as local processes: each named volume is a directory, each mount
    target is rewritten to it, and `nats` is this machine's nats-server on free ports."""

    def __init__(self, tmp: Path, services: dict) -> None:  # type: ignore[type-arg]
        from grid.transport.embedded import free_port

        self.tmp = tmp
        self.services = services
        self.port, self.monitor = free_port(), free_port()
        self.volumes: dict[str, Path] = {}

    def volume(self, name: str) -> Path:
        path = self.volumes.setdefault(name, self.tmp / name)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def mounts(self, service: str) -> dict[str, Path]:
        out = {}
        for spec in self.services[service].get("volumes", []):
            source, target = spec.split(":")[:2]
            if not source.startswith("."):
                out[target] = self.volume(source)
        return out

    def args(self, service: str) -> list[str]:
        mounts = self.mounts(service)
        out: list[str] = []
        for arg in self.services[service]["command"][1:]:
            arg = arg.replace("tls://nats:4222", f"tls://localhost:{self.port}")
            for target, path in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
                if arg == target or arg.startswith(target + "/"):
                    arg = str(path) + arg[len(target):]
                    break
            out.append("localhost" if arg == "nats" and out and out[-1] == "--tls-name" else arg)
        if service == "identity":  # the server's resolver and JetStream stores live in its own data volume
            for option, below in (("--resolver-dir", "/data/"), ("--store-dir", "/data/")):
                given = out[out.index(option) + 1]
                assert given.startswith(below), (option, given)
                out[out.index(option) + 1] = str(self.volume("nats-data") / given[len(below):])
        return out

    def env(self, service: str) -> dict[str, str]:
        import os

        env = {k: v for k, v in os.environ.items() if k not in ("GRID_NATS_URL", "GRID_AGENT_STATE_DIR")}
        env["GRID_HOME"] = str(self.mounts(service)["/grid"])
        # Variables the compose file requires from the operator (${VAR:?...}) get test values.
        for key, value in (self.services[service].get("environment") or {}).items():
            if isinstance(value, str) and value.startswith("${") and ":?" in value:
                env[key] = TEST_VALUES[key]
        return env

    def nats_config(self) -> Path:
        """The config the nats service runs (written by the identity service), on this test's ports."""
        command = self.services["nats"]["command"]
        target = command[command.index("-c") + 1]
        path = next(self.mounts("nats")[mount] / target[len(mount) + 1:]
                    for mount in self.mounts("nats") if target.startswith(mount + "/"))
        conf = path.read_text()
        assert "listen: 0.0.0.0:4222" in conf and "http: 127.0.0.1:8222" in conf, conf
        path.write_text(conf.replace("listen: 0.0.0.0:4222", f"listen: 127.0.0.1:{self.port}")
                        .replace("http: 127.0.0.1:8222", f"http: 127.0.0.1:{self.monitor}"))
        return path


def test_the_compose_services_run_secured_as_local_processes(tmp_path: Path) -> None:
    """Without Docker: the compose services' own commands, in dependency order, against the
    server config the identity service wrote, on a real nats-server; the agent joins with the
    invite and registers."""
    import subprocess
    import sys

    from grid.transport.embedded import find_nats_server

    local = _Local(tmp_path, _compose()["services"])
    gridctl = [sys.executable, "-m", "grid.cli.main"]
    procs: list[subprocess.Popen[bytes]] = []

    def once(service: str) -> None:
        done = subprocess.run([*gridctl, *local.args(service)], env=local.env(service), capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, f"{service}: {done.stderr}"

    def daemon(service: str, *extra: str) -> None:
        log = open(tmp_path / f"{service}.log", "wb")
        procs.append(subprocess.Popen([*gridctl, *local.args(service), *extra], env=local.env(service), stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    try:
        once("identity")
        procs.append(subprocess.Popen([str(find_nats_server()), "-c", str(local.nats_config())],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{local.monitor}/healthz", timeout=2).status_code == 200, 30)
        from grid.transport.embedded import free_port

        admin, gateway = free_port(), free_port()
        controller_args = local.args("controller")
        controller_args[controller_args.index("--port") + 1] = str(admin)
        log = open(tmp_path / "controller.log", "wb")
        procs.append(subprocess.Popen([*gridctl, *controller_args], env=local.env("controller"), stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{admin}/allocator/status", timeout=2).status_code == 200, 60)
        once("invite")
        gateway_args = local.args("gateway")
        gateway_args[gateway_args.index("--port") + 1] = str(gateway)
        log = open(tmp_path / "gateway.log", "wb")
        procs.append(subprocess.Popen([*gridctl, *gateway_args], env=local.env("gateway"), stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        daemon("agent", "--port-range", engine_ports_arg(), "--heartbeat-interval", "0.5")
        key = {"Authorization": f"Bearer {TEST_VALUES['GRID_GATEWAY_API_KEYS']}"}
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{gateway}/v1/models", headers=key, timeout=2).status_code == 200, 60)
        assert httpx.get(f"http://127.0.0.1:{gateway}/v1/models", timeout=2).status_code == 401

        def hosts() -> list[str]:
            status = httpx.get(f"http://127.0.0.1:{admin}/allocator/status", timeout=5).json()
            return [h["host_id"] for h in status["hosts"]]

        assert wait_for(lambda: "compose-agent" in hosts(), 60)
        # The agent's home holds its host credential and nothing of the controller's.
        agent_home = local.mounts("agent")["/grid"]
        assert (agent_home / "agent" / "identity" / "host.creds").exists()
        assert not (agent_home / "operator.token").exists() and not (agent_home / "identity").exists()
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
