"""The gridctl entry point: composes one Typer app per command group."""

from __future__ import annotations

import logging

import typer

from grid import __version__
from grid.logs import configure_logging
from grid.cli import chat, history, invite, model_evaluate, model_push, natsinit, up
from grid.cli.admin import model_app
from grid.cli.admin import register as register_admin
from grid.cli.dashboard import dashboard_app
from grid.cli.engine import engine_app
from grid.cli.events import events_app
from grid.cli.host import host_app
from grid.cli.machine import machine_app
from grid.cli.node import node_app
from grid.cli.pull import pull
from grid.cli.qualify import qualify_app
from grid.cli.replay import replay_command
from grid.cli.test_cmd import test_app

app = typer.Typer(
    name="gridctl",
    help="Grid: place AI models on a mixed fleet and serve them behind one OpenAI-compatible gateway.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gridctl {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the gridctl version and exit."),
) -> None:
    """Grid: place AI models on a mixed fleet and serve them behind one OpenAI-compatible gateway."""
    # Until a long-running command sets its own format, warnings go to stderr: structlog's
    # default prints to stdout, where a warning would corrupt a read command's --json output.
    configure_logging("auto", level=logging.WARNING)
up.register(app)  # gridctl up, down, serve
app.add_typer(events_app, name="events")
app.add_typer(node_app, name="node")
app.add_typer(engine_app, name="engine")  # gridctl engine add|rm|ls (external engines)
app.add_typer(qualify_app, name="qualify")  # gridctl qualify llama.cpp|external (runtime qualification)
app.add_typer(host_app, name="host")  # gridctl host drain|pause|quarantine|resume HOST
app.add_typer(machine_app, name="machine")  # gridctl machine add|join (controller, gateway, operator machines)
app.add_typer(dashboard_app, name="dashboard")
app.command("pull")(pull)
app.command("replay")(replay_command)
app.add_typer(test_app, name="test")  # gridctl test start|status|watch|stop, scenario, graduate
history.register(app)  # gridctl history
chat.register(app)  # gridctl models, gridctl chat
register_admin(app)  # gridctl status, model set/rm, mode, tick
model_push.register(model_app)  # gridctl model push
model_evaluate.register(model_app)  # gridctl model evaluate
invite.register(app)  # gridctl invite
natsinit.register(app)  # gridctl nats init


@app.command("version")
def version() -> None:
    """Print the gridctl version."""
    typer.echo(__version__)


if __name__ == "__main__":
    app()
