"""A host's fetch of an artifact from the grid's artifact store, resumable, into its cache.

The bytes go to the cache's staging file for the digest; beside it a small resume record says
which object (its chunk subject's nuid) the partial belongs to, how many bytes of it are whole
chunks, and the stream sequence of the last of them. The record is written only after those
bytes are on disk, so after an interruption (lost connection, killed agent) the next attempt
truncates the partial to the recorded length and asks for the chunks after that sequence. The
complete file is published by ArtifactCache.publish: hashed, and renamed into place only when
it hashes to the digest it was asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import msgspec
from nats.js import JetStreamContext

from grid.agent.artifacts import (
    REASON_DIGEST_MISMATCH,
    REASON_INSUFFICIENT_DISK,
    REASON_NOT_CACHED,
    REASON_SIZE_CEILING,
    REASON_STORE_UNAVAILABLE,
    ArtifactCache,
    ArtifactOutcome,
    Progress,
)
from grid.agent.state import atomic_write
from grid.transport.artifact_store import (
    ArtifactStoreError,
    StoreMissing,
    StoredArtifact,
    read_chunks,
    stored_artifact,
)

# The resume record is rewritten at most once per this many bytes (each write is two fsyncs).
CHECKPOINT_BYTES = 8 * 1024 * 1024
SOURCE_LABEL = "grid"


class ResumePoint(msgspec.Struct, frozen=True, kw_only=True):
    nuid: str
    size: int  # bytes of whole chunks in the partial file
    seq: int  # stream sequence of the last of them


_resume_decoder = msgspec.json.Decoder(ResumePoint)


def _fail(reason: str, detail: str, transferred: int = 0) -> ArtifactOutcome:
    return ArtifactOutcome(ok=False, reason=reason, detail=detail, transferred_bytes=transferred)


def resume_path(cache: ArtifactCache, sha256: str) -> Path:
    staged = cache.staging_path(sha256)
    return staged.with_name(staged.name + ".resume")


def _discard(cache: ArtifactCache, sha256: str) -> None:
    cache.staging_path(sha256).unlink(missing_ok=True)
    resume_path(cache, sha256).unlink(missing_ok=True)


def _resume_point(cache: ArtifactCache, artifact: StoredArtifact) -> ResumePoint:
    """Where to continue: the recorded point when the partial belongs to this very object and
    holds at least the recorded bytes (then cut to them), else the start."""
    staged = cache.staging_path(artifact.sha256)
    try:
        point = _resume_decoder.decode(resume_path(cache, artifact.sha256).read_bytes())
        on_disk = staged.stat().st_size
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return ResumePoint(nuid=artifact.nuid, size=0, seq=0)
    if point.nuid != artifact.nuid or on_disk < point.size or point.size > artifact.size or point.seq < 0:
        return ResumePoint(nuid=artifact.nuid, size=0, seq=0)
    return point


class GridArtifactSource:
    """The agent's read-only view of the artifact store (its credential allows stream message gets only)."""

    def __init__(self, js: JetStreamContext, *, checkpoint_bytes: int = CHECKPOINT_BYTES) -> None:
        self.js = js
        self.checkpoint_bytes = checkpoint_bytes

    async def fetch(self, cache: ArtifactCache, sha256: str, max_bytes: int | None, *,
                    model_id: str | None, progress: Progress | None = None) -> ArtifactOutcome:
        try:
            artifact = await stored_artifact(self.js, sha256)
        except StoreMissing:
            return _fail(REASON_NOT_CACHED, f"{sha256[:12]}... (and the grid has no artifact store)")
        except ArtifactStoreError as exc:
            return _fail(REASON_STORE_UNAVAILABLE, str(exc))
        if artifact is None:
            return _fail(REASON_NOT_CACHED, f"{sha256[:12]}... is not in the grid's artifact store either "
                                            "(`gridctl model push FILE` stores it)")
        # Refused before a byte moves: a declared size over the ceiling, or a disk too small.
        if max_bytes is not None and artifact.size > max_bytes:
            return _fail(REASON_SIZE_CEILING, f"stored object is {artifact.size} bytes > ceiling {max_bytes}")
        if not artifact.digest_matches:
            _discard(cache, sha256)
            return _fail(REASON_DIGEST_MISMATCH, f"the stored object does not hash to {sha256[:12]}...")
        cache.ensure()
        point = await asyncio.to_thread(_resume_point, cache, artifact)
        free, _ = cache.disk_usage()
        if free is not None and free < artifact.size - point.size:
            return _fail(REASON_INSUFFICIENT_DISK, f"{free} bytes free < {artifact.size - point.size} to fetch")
        return await self._transfer(cache, artifact, point, model_id=model_id, progress=progress)

    async def _transfer(self, cache: ArtifactCache, artifact: StoredArtifact, point: ResumePoint, *,
                        model_id: str | None, progress: Progress | None) -> ArtifactOutcome:
        sha256 = artifact.sha256
        staged = cache.staging_path(sha256)
        record = resume_path(cache, sha256)
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT, 0o600)
        done, seq, since_checkpoint = point.size, point.seq, 0

        def checkpoint() -> None:
            os.fdatasync(fd)  # the bytes first, then the record that vouches for them
            atomic_write(record, msgspec.json.encode(ResumePoint(nuid=artifact.nuid, size=done, seq=seq)))

        try:
            os.ftruncate(fd, done)
            os.lseek(fd, done, os.SEEK_SET)
            try:
                async for chunk_seq, data in read_chunks(self.js, artifact, after_seq=seq):
                    if done + len(data) > artifact.size:
                        os.close(fd)
                        fd = -1
                        _discard(cache, sha256)
                        return _fail(REASON_SIZE_CEILING, f"object sent more than its declared {artifact.size} bytes",
                                     done - point.size)
                    os.write(fd, data)
                    done += len(data)
                    seq = chunk_seq
                    since_checkpoint += len(data)
                    if progress is not None:
                        progress(done, artifact.size)
                    if done == artifact.size:
                        break
                    if since_checkpoint >= self.checkpoint_bytes:
                        await asyncio.to_thread(checkpoint)
                        since_checkpoint = 0
            except ArtifactStoreError as exc:
                # Keep the partial: the next attempt continues after the last whole chunk.
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(checkpoint)
                return _fail(REASON_STORE_UNAVAILABLE, str(exc), done - point.size)
        finally:
            if fd >= 0:
                os.close(fd)
        transferred = done - point.size
        record.unlink(missing_ok=True)
        if done != artifact.size:
            staged.unlink(missing_ok=True)
            return _fail(REASON_STORE_UNAVAILABLE, f"object ended after {done} of {artifact.size} bytes", transferred)
        outcome = await asyncio.to_thread(cache.publish, staged, sha256, model_id=model_id,
                                          source=SOURCE_LABEL, fetched=True)
        return msgspec.structs.replace(outcome, transferred_bytes=transferred)
