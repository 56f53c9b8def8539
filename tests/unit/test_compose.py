"""docker-compose.yml describes the real topology with real gridctl commands."""

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


def test_compose_has_the_four_services_with_real_gridctl_commands() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"nats", "controller", "gateway", "agent"} <= set(services)
    nats_command = services["nats"]["command"]
    conf = nats_command[nats_command.index("-c") + 1]
    assert any(v.split(":")[1] == conf for v in services["nats"]["volumes"])
    conf_text = (ROOT / "deploy" / "nats.conf").read_text()
    assert "jetstream" in conf_text and "sync_interval: always" in conf_text
    for name in ("controller", "gateway", "agent"):
        command = services[name]["command"]
        assert command[0] == "gridctl", name
        ctx = resolve(command[1:])
        assert ctx.params.get("nats") == "nats://nats:4222", name
