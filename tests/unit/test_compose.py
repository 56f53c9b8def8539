"""docker-compose.yml describes the real topology with real gridctl commands (parsed by gridctl
itself; tests/e2e/test_compose.py runs the topology)."""

from __future__ import annotations

from pathlib import Path

import typer.main
import yaml

from grid.cli.main import app

ROOT = Path(__file__).resolve().parents[2]


def is_group(command: object) -> bool:
    return hasattr(command, "list_commands")


def resolve(args: list[str]):  # type: ignore[no-untyped-def]
    """Parse `gridctl <args>` exactly as the CLI would, without running it."""
    command = typer.main.get_command(app)
    rest = list(args)
    name = "gridctl"
    while is_group(command) and rest and not rest[0].startswith("-"):
        sub = command.get_command(command.make_context(name, [], resilient_parsing=True), rest[0])
        assert sub is not None, f"gridctl has no command {' '.join(args[: len(args) - len(rest) + 1])!r}"
        name, command, rest = rest[0], sub, rest[1:]
    assert not is_group(command), f"{args} names a command group, not a command"
    return command.make_context(name, rest)


LONG_RUNNING = ("nats", "controller", "gateway", "agent")
GRIDCTL_SERVICES = ("identity", "invite", "controller", "gateway", "agent")


def _compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_the_services_with_real_gridctl_commands() -> None:
    services = _compose()["services"]
    assert set(LONG_RUNNING) | set(GRIDCTL_SERVICES) <= set(services)
    # NATS runs the whole config the identity service's `nats init` writes into the shared volume
    # (its contents pass nats-server's own check in tests/e2e/test_compose.py).
    nats_command = services["nats"]["command"]
    assert _program(services["nats"])[0] == "nats-server"
    conf = Path(nats_command[nats_command.index("-c") + 1])
    identity = resolve(services["identity"]["command"][1:]).params
    assert conf == identity["server_dir"] / "nats-server.conf"
    assert f"nats-config:{identity['server_dir']}:ro" in services["nats"]["volumes"]
    assert f"nats-config:{identity['server_dir']}" in services["identity"]["volumes"]
    assert identity["store_dir"].is_relative_to("/data") and "nats-data:/data" in services["nats"]["volumes"]
    for name in GRIDCTL_SERVICES:
        command = services[name]["command"]
        assert command[0] == "gridctl", name
        ctx = resolve(command[1:])
        if name in LONG_RUNNING:
            assert ctx.params.get("nats") == "tls://nats:4222", name


def test_compose_comes_up_secured() -> None:
    services = _compose()["services"]
    # NATS: no port published; monitoring on loopback, accounts and TLS are the written config's.
    assert "ports" not in services["nats"]
    identity = resolve(services["identity"]["command"][1:]).params
    assert identity["tls_name"] == ["nats"] and identity["server_dir"] == Path("/etc/nats/grid")
    # The admin API is published on the host's loopback only.
    assert all(p.startswith("127.0.0.1:") for p in services["controller"]["ports"])
    # The agent holds its own home and the join token, never the controller's home (authority,
    # operator token) nor the gateway's.
    agent_volumes = {v.split(":")[0] for v in services["agent"]["volumes"]}
    assert agent_volumes == {"agent-home", "agent-join"}
    assert "grid-home" not in {v.split(":")[0] for v in services["gateway"]["volumes"]}
    assert resolve(services["agent"]["command"][1:]).params["join_token_file"] == Path("/join/token")
    invite = resolve(services["invite"]["command"][1:]).params
    assert invite["output"] == Path("/join/token") and invite["server"] == "tls://nats:4222"
    for name in LONG_RUNNING:
        assert services[name].get("restart") == "unless-stopped", name
        assert "healthcheck" in services[name], name


# --- the default (highly available) topology, which tests/deploy/test_compose.py runs for real ---

HA_GRIDCTL = ("identity-ha", "controller-a", "controller-b", "invite-ha", "gateway-a", "gateway-b", "agent-ha")
HA_NATS = ("nats-1", "nats-2", "nats-3")
HA_LONG_RUNNING = (*HA_NATS, "controller-a", "controller-b", "gateway-a", "gateway-b", "gateway-tls", "agent-ha")
SINGLE = ("identity", "nats", "controller", "invite", "gateway", "agent")


def _grid_wait():  # type: ignore[no-untyped-def]
    """deploy/podman/grid-wait as a module (it has no .py suffix: it is the image's entrypoint)."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("grid_wait", str(ROOT / "deploy" / "podman" / "grid-wait"))
    spec = importlib.util.spec_from_loader("grid_wait", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _waits(service: dict) -> tuple[list[str], list[str]]:  # type: ignore[type-arg]
    """The files and TCP endpoint groups a service's grid-wait entrypoint waits for."""
    entrypoint = service.get("entrypoint") or []
    if not entrypoint:
        return [], []
    assert entrypoint[0] == "grid-wait" and "--" in entrypoint, entrypoint
    import argparse

    args = argparse.ArgumentParser()
    args.add_argument("--file", action="append", default=[])
    args.add_argument("--tcp", action="append", default=[])
    args.add_argument("--timeout", type=float)
    parsed = args.parse_args(entrypoint[1:entrypoint.index("--")])
    return parsed.file, parsed.tcp


def _program(service: dict) -> list[str]:  # type: ignore[type-arg]
    """What a service runs once grid-wait is done: the rest of its entrypoint, then its command."""
    entrypoint = service.get("entrypoint") or []
    rest = entrypoint[entrypoint.index("--") + 1:] if entrypoint else []
    return [*rest, *service["command"]]


def _mounted(service: dict, path: str) -> bool:  # type: ignore[type-arg]
    return any(path == spec.split(":")[1] or path.startswith(spec.split(":")[1].rstrip("/") + "/")
               for spec in service.get("volumes", []))


def test_compose_runs_the_highly_available_topology_by_default() -> None:
    compose = _compose()
    services = compose["services"]
    default = {name for name, s in services.items() if not s.get("profiles")}
    assert default == {*HA_GRIDCTL, *HA_NATS, "gateway-tls", "bundled-model"}
    assert all(services[name]["profiles"] == ["single"] for name in SINGLE)
    assert services["first-answer"]["profiles"] == ["ask"]
    for name in HA_GRIDCTL:
        command = services[name]["command"]
        assert command[0] == "gridctl", name
        ctx = resolve(command[1:])
        if name in ("controller-a", "controller-b", "gateway-a", "gateway-b", "agent-ha"):
            assert ctx.params["nats"] == "tls://nats-1:4222,tls://nats-2:4222,tls://nats-3:4222", name
    # Each NATS node runs the config `nats cluster-config` wrote for it into the shared volume.
    identity = resolve(services["identity-ha"]["command"][1:]).params
    assert identity["host"] == list(HA_NATS) and identity["tls"]
    for n, name in enumerate(HA_NATS, start=1):
        command = _program(services[name])
        assert command[:2] == ["nats-server", "-c"], command
        assert Path(command[2]) == identity["output"] / f"grid-n{n}" / "nats.conf"
        assert _waits(services[name])[0] == [command[2]]
        assert f"ha-nats-config:{identity['output']}:ro" in services[name]["volumes"]
        assert f"ha-nats-{n}:/data" in services[name]["volumes"]
    for name in HA_LONG_RUNNING:
        assert services[name].get("restart") == "unless-stopped", name
        assert "healthcheck" in services[name], name


def test_compose_services_wait_for_what_they_need_instead_of_depends_on() -> None:
    """podman-compose turns depends_on into podman's --requires, which starts a finished one-shot
    (the identity) again whenever a dependent starts; the services wait with grid-wait instead."""
    services = _compose()["services"]
    for name, service in services.items():
        assert "depends_on" not in service, name
        files, groups = _waits(service)
        for path in files:
            assert _mounted(service, path), (name, path)
        for group in groups:
            for endpoint in group.split(","):
                host, _, port = endpoint.rpartition(":")
                assert host in services and port.isdigit(), (name, endpoint)
    # The agent waits for its join token, which invite-ha writes into the volume they share.
    invite = resolve(services["invite-ha"]["command"][1:]).params
    assert str(invite["output"]) in _waits(services["agent-ha"])[0]
    assert resolve(services["agent-ha"]["command"][1:]).params["join_token_file"] == invite["output"]


def test_grid_wait_reports_what_is_missing(tmp_path: Path, taken_port: int) -> None:
    import argparse

    wait = _grid_wait()
    token = tmp_path / "token"
    args = argparse.Namespace(file=[str(token)], tcp=[f"127.0.0.1:1,127.0.0.1:{taken_port}", "127.0.0.1:1"])
    assert wait.missing(args) == [f"file {token}", "tcp 127.0.0.1:1"]
    token.write_text("t\n")
    args.tcp = [f"127.0.0.1:1,127.0.0.1:{taken_port}"]
    assert wait.missing(args) == []


def test_compose_ha_is_secured() -> None:
    compose = _compose()
    services = compose["services"]
    # Clients elsewhere reach the gateways only through the TLS proxy; the admin APIs and the
    # gateways' plain HTTP are published on the host's loopback only.
    published = {name: s["ports"] for name, s in services.items() if s.get("ports") and not s.get("profiles")}
    assert set(published) == {"controller-a", "controller-b", "gateway-a", "gateway-b", "gateway-tls"}
    assert all(p.startswith("127.0.0.1:") for name in ("controller-a", "controller-b", "gateway-a", "gateway-b")
               for p in published[name])
    assert published["gateway-tls"] == ["${GRID_HTTPS_PORT:-8443}:8443"]
    for name in ("gateway-a", "gateway-b", "first-answer"):
        assert services[name]["environment"]["GRID_GATEWAY_API_KEYS"].startswith("${GRID_GATEWAY_API_KEYS:?")
    # The agent holds its own home and the join token only.
    assert {v.split(":")[0] for v in services["agent-ha"]["volumes"]} == {"ha-agent-home", "ha-agent-join"}
    assert "ha-identity" not in {v.split(":")[0] for v in services["gateway-a"]["volumes"]}
    # The containers' subnet is declared, not left to the engine.
    subnet = compose["networks"]["default"]["ipam"]["config"][0]["subnet"]
    assert subnet.startswith("${GRID_COMPOSE_SUBNET:-") and subnet.endswith("/24}")


def test_the_image_compiles_nothing() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "[native]" not in dockerfile and "build-essential" not in dockerfile and "cmake" not in dockerfile
    assert "ARG BASE=localhost/grid-base:bookworm" in dockerfile
