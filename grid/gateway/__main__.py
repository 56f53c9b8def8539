"""`python -m grid.gateway [--nats URL] [--host H] [--port P]`: the gateway as its own process.

A thin alias of `gridctl serve gateway` (the same typer command, options and defaults), for
deployments and benchmarks that start the gateway by module name.
"""

from __future__ import annotations

import typer

from grid.cli.up import serve_gateway_command


def main() -> None:
    typer.run(serve_gateway_command)


if __name__ == "__main__":
    main()
