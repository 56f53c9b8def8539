"""gridctl test: harnesses that run Grid for testing on this machine.

One group for the logical multi-machine fleet (real processes) and the scenario lab (a
simulated fleet through the production tick); each adds its commands here.
"""

from __future__ import annotations

import typer

from grid.cli import scenario, testfleet

test_app = typer.Typer(help="Test harnesses on this machine: a logical multi-machine fleet (start, status, "
                            "watch, stop) and the scenario lab (scenario, graduate, flapping).", no_args_is_help=True)
testfleet.register(test_app)
test_app.command("scenario")(scenario.scenario)
test_app.command("graduate")(scenario.graduate)
test_app.command("flapping")(scenario.flapping)
