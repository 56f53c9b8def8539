"""Helpers shared by gridctl command groups: config, log connection, JSON output."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import typer
from rich.console import Console

from grid.config import MACHINE_FILE, GridConfig, NatsUrlNotFound
from grid.config import resolve_nats_url as resolve_configured_nats_url
from grid.events.log import LogError
from grid.logs import LOG_FORMATS
from grid.transport.jetstream import JetStreamLog

T = TypeVar("T")

# Width when the output is not a terminal (piped, redirected) and COLUMNS does not say: wide
# enough that tables print every value whole, each row on one line, rather than cut to the
# 80 columns rich assumes (`gridctl status | grep host-…` finds the host's whole row).
UNBOUNDED_WIDTH = 100_000


def _width(stream: Any) -> int | None:
    if os.environ.get("COLUMNS"):
        return None  # rich reads COLUMNS itself
    try:
        return None if stream.isatty() else UNBOUNDED_WIDTH
    except (AttributeError, ValueError):
        return UNBOUNDED_WIDTH


console = Console(width=_width(sys.stdout))
err_console = Console(stderr=True, width=_width(sys.stderr))

NatsOption = typer.Option(None, "--nats", envvar="GRID_NATS_URL", help="NATS URL of the grid (default: the local `gridctl up`).")
JsonOption = typer.Option(False, "--json", help="Print machine-readable JSON.")


def _log_format(value: str) -> str:
    if value not in LOG_FORMATS:
        raise typer.BadParameter(f"one of {', '.join(LOG_FORMATS)}, not {value!r}")
    return value


# Every long-running process (`up`, `node start`, `serve ...`) takes this and passes it to
# grid.logs.configure_logging before it starts anything.
LogFormatOption = typer.Option(
    "auto", "--log-format", callback=_log_format, metavar="auto|json|console",
    help="Log lines on stderr: json, console (for people), or auto (console on a terminal, json otherwise).",
)


def config() -> GridConfig:
    return GridConfig.from_environ()


NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def check_nats_url(url: str) -> str:
    """Refuse what is not a NATS server URL (say `http://...`) before any connection attempt,
    which would otherwise end in a resolver error far from the cause."""
    for part in url.split(","):  # nats-py accepts a comma-separated list of servers
        scheme, sep, rest = part.strip().partition("://")
        host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
        if not sep or scheme.lower() not in NATS_SCHEMES or not host or host.startswith(":"):
            fail(f"{part.strip()!r} is not a NATS server URL: use nats://HOST:PORT (or tls://, ws://, wss://); "
                 "the gateway and admin API are HTTP, NATS is not")
    return url


def resolve_nats_url(explicit: str | None, cfg: GridConfig | None = None) -> str:
    """grid.config.resolve_nats_url, with its NatsUrlNotFound turned into a clear CLI error."""
    try:
        return check_nats_url(resolve_configured_nats_url(explicit, cfg or config()))
    except NatsUrlNotFound as exc:
        fail(f"no grid found: start one with `gridctl up`, join one with `gridctl machine join BUNDLE`, or pass "
             f"--nats URL / set GRID_NATS_URL (looked for {exc.recorded} and {exc.recorded.with_name(MACHINE_FILE)})")
        raise AssertionError from exc  # unreachable: fail() exits


def fail(message: str, code: int = 1) -> None:
    err_console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    try:
        return asyncio.run(coro_fn())  # type: ignore[arg-type]
    except LogError as exc:
        fail(str(exc))
        raise AssertionError from exc


async def connect(url: str | None, *, name: str = "gridctl") -> JetStreamLog:
    """The CLI's own connection to the log: as the operator identity when this grid home has
    one (`gridctl up` made it), which reads every stream and manages none."""
    from grid.identity.connect import connect_log
    from grid.identity.local import local_credential, local_tls_ca

    home = config().home
    credentials = local_credential(home, "operator")
    return await connect_log(resolve_nats_url(url), credentials=credentials, name=name,
                             tls_ca=local_tls_ca(home) if credentials is not None else None,
                             ensure_streams=credentials is None)


def print_json(value: Any) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value), indent=2).decode() + "\n")


def runtimes_text(runtimes: Any) -> str:
    """The hardware table's runtimes cell with each runtime's version, e.g.
    'llama.cpp(cpu) xllamacpp 2026.10.11549' (unknown versions show nothing after the backends)."""
    return ", ".join(f"{r['runtime']}({'+'.join(r['backends']) or '-'})"
                     + (f" {r['version']}" if r.get("version") else "") for r in runtimes) or "-"


def hardware_cells_with_versions(hw: dict[str, Any]) -> tuple[str, ...]:
    """grid.fleet.hardware.hardware_cells with the runtimes cell naming each runtime's version."""
    from grid.fleet.hardware import hardware_cells

    return (*hardware_cells(hw)[:-1], runtimes_text(hw["runtimes"]))
