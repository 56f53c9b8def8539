"""gridctl test: development fleets and the scenario lab."""

from __future__ import annotations

import typer

from grid.cli import scenario

test_app = typer.Typer(help="Test fleets and the scenario lab.", no_args_is_help=True)
test_app.command("scenario")(scenario.scenario)
test_app.command("graduate")(scenario.graduate)
