"""gridctl test: harnesses that run Grid for testing on this machine.

The group lives in its own file so other harnesses (the scenario lab) can add commands to it
without touching the fixture's.
"""

from __future__ import annotations

import typer

from grid.cli import testfleet

test_app = typer.Typer(help="Test harnesses on this machine: a logical multi-machine fleet (start, status, "
                            "watch, stop).", no_args_is_help=True)
testfleet.register(test_app)


def register(app: typer.Typer) -> None:
    app.add_typer(test_app, name="test")
