"""gridctl model push FILE [--model ID]: store a model file in the grid's artifact store.

The blob is named by its sha256 (computed here), so pushing the same file twice stores it once.
Hosts that lack it fetch it from there when its profile names no other source. With --model the
profile's artifact digest and size ceiling are set to this file's (only those two fields change).
`gridctl pull smollm2` calls `store_in_grid` too, when it runs where a grid is reachable.
"""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path
from typing import Optional

import nats.errors
import nats.js.errors
import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from grid.agent.artifacts import MIB, hash_file
from grid.cli.admin import AdminOption, TokenFileOption, admin_url, operator_token, request
from grid.cli.common import JsonOption, NatsOption, config, console, err_console, fail, print_json
from grid.config import NatsUrlNotFound
from grid.config import resolve_nats_url as resolve_configured_nats_url
from grid.events.log import LogError
from grid.events.subjects import ARTIFACT_STREAM
from grid.transport.artifact_store import ArtifactStoreError, PutResult, put_artifact


def _progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), disable=not sys.stderr.isatty(), console=err_console)


class StoreUnavailable(Exception):
    pass


async def store_in_grid(path: Path, sha256: str, *, nats_url: str | None) -> PutResult:
    """Put `path` (whose digest is `sha256`) into the artifact store of the grid at `nats_url`,
    as this machine's operator identity. Raises StoreUnavailable with the reason it could not."""
    from grid.cli.common import connect

    try:
        url = resolve_configured_nats_url(nats_url, config())
    except NatsUrlNotFound as exc:
        raise StoreUnavailable("no grid found (no --nats, GRID_NATS_URL or running `gridctl up`)") from exc
    try:
        log = await connect(url, name="gridctl-push")
    except LogError as exc:
        raise StoreUnavailable(str(exc)) from exc
    try:
        js = log.jetstream
        try:
            await js.stream_info(ARTIFACT_STREAM)
        except nats.js.errors.NotFoundError as exc:
            raise StoreUnavailable("this grid has no artifact store yet: the controller creates it when it "
                                   "starts (restart it with this version)") from exc
        except (nats.errors.Error, asyncio.TimeoutError) as exc:
            raise StoreUnavailable(f"cannot read the artifact store ({type(exc).__name__}): does this "
                                   "machine hold the grid's operator credential?") from exc
        with _progress() as progress:
            task = progress.add_task("push", total=path.stat().st_size)
            try:
                return await put_artifact(js, path, sha256,
                                          progress=lambda done, total: progress.update(task, completed=done))
            except ArtifactStoreError as exc:
                raise StoreUnavailable(str(exc)) from exc
    finally:
        await log.close()


def push(
    file: Path = typer.Argument(..., help="The model file (e.g. a GGUF) to store in the grid."),
    model: Optional[str] = typer.Option(
        None, "--model", help="Also record this file's sha256 and size ceiling in that profile (only those fields)."),
    nats_url: Optional[str] = NatsOption,
    admin: Optional[str] = AdminOption,
    token_file: Optional[Path] = TokenFileOption,
    json_out: bool = JsonOption,
) -> None:
    """Store a model file in the grid's artifact store, named by its sha256 (idempotent)."""
    if not file.is_file():
        fail(f"{file} is not a readable file", code=2)
    size = file.stat().st_size
    if size == 0:
        fail(f"{file} is empty", code=2)
    # The token is read before the long part, so a missing one fails at once.
    token = operator_token(token_file) if model else None
    with _progress() as progress:
        task = progress.add_task("sha256", total=size)
        try:
            sha256, hashed = hash_file(file, lambda done, total: progress.update(task, completed=done))
        except OSError as exc:
            fail(f"cannot read {file}: {exc.strerror}", code=2)
            raise AssertionError from exc
    try:
        result = asyncio.run(store_in_grid(file, sha256, nats_url=nats_url))
    except StoreUnavailable as exc:
        fail(f"not stored: {exc}")
        raise AssertionError from exc
    size_mb = max(1, math.ceil(hashed / MIB))
    profile = None
    if model:
        profile = request("PATCH", admin_url(admin), f"/allocator/models/{model}", token=token,
                          body={"artifact_sha256": sha256, "artifact_size_mb": size_mb}, missing_ok=True)
        if profile is None:
            fail(f"stored, but there is no profile {model!r}: create it with `gridctl model set {model} "
                 f"--memory-mb N --artifact-sha256 {sha256} --artifact-size-mb {size_mb}`")
    if json_out:
        print_json({"sha256": sha256, "size_bytes": result.size, "result": result.reason, "model": model})
        return
    verb = "already stored" if result.reason != "stored" else "stored"
    console.print(f"{file.name}: {verb} in the grid, sha256 {sha256}, {result.size} bytes ({result.size / MIB:.1f} MiB)")
    if model:
        console.print(f"profile {model}: artifact_sha256={sha256} artifact_size_mb={size_mb}")


def register(model_app: typer.Typer) -> None:
    model_app.command("push")(push)
