"""The gridctl entry point: composes one Typer app per command group."""

from __future__ import annotations

import typer

from grid import __version__
from grid.cli.events import events_app

app = typer.Typer(
    name="gridctl",
    help="Grid: place AI models on a mixed fleet and serve them behind one OpenAI-compatible gateway.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(events_app, name="events")
__import__("grid.cli.history", fromlist=["register"]).register(app)  # gridctl replay, gridctl history
__import__("grid.cli.chat", fromlist=["register"]).register(app)  # gridctl models, gridctl chat


@app.command("version")
def version() -> None:
    """Print the gridctl version."""
    typer.echo(__version__)


if __name__ == "__main__":
    app()
