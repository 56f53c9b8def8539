"""gridctl dashboard: the credentials that open the live dashboard from another machine.

On loopback the dashboard is open; elsewhere it needs a token. The reader token lets someone
watch (dashboard, its live stream, status, history, metrics) without being able to change
anything; the operator token can do everything, so print it only for yourself.
"""

from __future__ import annotations

import typer

from grid.cli.common import JsonOption, config, fail, print_json
from grid.secrets import SecretFileError, load_or_create_secret, read_secret

dashboard_app = typer.Typer(help="The live dashboard's credentials.", no_args_is_help=True)


@dashboard_app.command("token")
def token(
    reader: bool = typer.Option(
        True, "--reader/--operator",
        help="Print the read-only reader token (default; created on first use) or the operator token.",
    ),
    as_json: bool = JsonOption,
) -> None:
    """Print a token that opens the dashboard off loopback (open it with URL/?token=TOKEN)."""
    cfg = config()
    path = cfg.reader_token_path if reader else cfg.operator_token_path
    try:
        if reader:
            value = load_or_create_secret(path)
        elif path.exists():
            value = read_secret(path)
        else:
            fail(f"no operator token at {path}: `gridctl up` creates it")
            return
    except (SecretFileError, OSError) as exc:
        fail(str(exc))
        return
    if as_json:
        print_json({"kind": "reader" if reader else "operator", "token": value, "path": str(path)})
    else:
        typer.echo(value)
