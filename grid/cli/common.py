"""Helpers shared by gridctl command groups: config, log connection, JSON output."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import typer
from rich.console import Console

from grid.config import GridConfig
from grid.events.jetstream import JetStreamLog
from grid.events.log import LogError

T = TypeVar("T")
console = Console()
err_console = Console(stderr=True)

NatsOption = typer.Option(None, "--nats", envvar="GRID_NATS_URL", help="NATS URL of the grid (default: the local `gridctl up`).")
JsonOption = typer.Option(False, "--json", help="Print machine-readable JSON.")


def config() -> GridConfig:
    return GridConfig.from_environ()


def resolve_nats_url(explicit: str | None, cfg: GridConfig | None = None) -> str:
    """--nats / GRID_NATS_URL, else the URL a running `gridctl up` recorded in the grid home."""
    if explicit:
        return explicit
    cfg = cfg or config()
    recorded = cfg.home / "nats.url"
    if recorded.exists():
        return recorded.read_text().strip()
    fail(f"no grid found: start one with `gridctl up`, or pass --nats URL (looked for {recorded})")
    raise AssertionError  # unreachable


def fail(message: str, code: int = 1) -> None:
    err_console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    try:
        return asyncio.run(coro_fn())  # type: ignore[arg-type]
    except LogError as exc:
        fail(str(exc))
        raise AssertionError from exc


async def connect(url: str | None) -> JetStreamLog:
    return await JetStreamLog.connect(resolve_nats_url(url), name="gridctl")


def print_json(value: Any) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value), indent=2).decode() + "\n")
