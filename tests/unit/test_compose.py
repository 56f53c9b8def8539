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
