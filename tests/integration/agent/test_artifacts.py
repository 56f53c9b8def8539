"""Artifact cache and fetch path against a real local HTTP server started by the test."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from grid.agent.artifacts import (
    FILE_ROOTS_ENV,
    REASON_SOURCE_NOT_ALLOWED,
    MIB,
    REASON_CACHE_HIT,
    REASON_DIGEST_MISMATCH,
    REASON_FETCHED,
    REASON_HUB_OFFLINE,
    REASON_NOT_CACHED,
    REASON_SIZE_CEILING,
    REASON_SOURCE_INCOMPLETE,
    ArtifactCache,
    SourceError,
    parse_source,
)
from grid.events.commands import CommandWithdrawn
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import HOST, heartbeats, make_command, terminal_acks, wait_ack, wait_for


class _Files:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.no_length: set[str] = set()
        self.ranges: list[str | None] = []
        # Serve at most this many bytes of a response, then drop the connection.
        self.cut_after: int | None = None
        # Trickle: seconds to sleep between 64 KiB chunks.
        self.trickle: float = 0.0


def _handler(files: _Files) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            body = files.blobs.get(self.path)
            if body is None:
                self.send_error(404)
                return
            files.ranges.append(self.headers.get("Range"))
            start = 0
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                start = int(rng[6:].split("-")[0])
                if start >= len(body):
                    self.send_response(416)
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            else:
                self.send_response(200)
            payload = body[start:]
            if self.path not in files.no_length:
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if files.cut_after is not None:
                payload = payload[: files.cut_after]
                files.cut_after = None
            if files.trickle:
                for i in range(0, len(payload), 65536):
                    self.wfile.write(payload[i : i + 65536])
                    self.wfile.flush()
                    time.sleep(files.trickle)
                return
            self.wfile.write(payload)

    return Handler


@pytest.fixture
def http_files() -> Iterator[tuple[str, _Files]]:
    files = _Files()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(files))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", files
    finally:
        server.shutdown()
        server.server_close()


def _blob(n: int, seed: int = 1) -> tuple[bytes, str]:
    data = (hashlib.sha256(str(seed).encode()).digest() * (n // 32 + 1))[:n]
    return data, hashlib.sha256(data).hexdigest()


def test_source_parsing():
    hf = parse_source("hf://owner/repo@abc123/sub/model.Q4.gguf")
    assert (hf.owner, hf.repo, hf.revision, hf.path) == ("owner", "repo", "abc123", "sub/model.Q4.gguf")
    assert parse_source("hf://o/r/m.gguf").revision == "main"
    assert parse_source("file:///tmp/x.gguf").location == "/tmp/x.gguf"
    for bad in ("hf://o/r/../m.gguf", "hf://o/r/m.bin", "hf://o", "http://user:pw@host/x.gguf",
                "ftp://host/x.gguf", "file://remote/x.gguf", "file:relative.gguf"):
        with pytest.raises(SourceError):
            parse_source(bad)


async def test_fetch_verify_publish_and_cache_hit(tmp_path: Path, http_files):
    base, files = http_files
    data, sha = _blob(300_000)
    files.blobs["/m.gguf"] = data
    cache = ArtifactCache(tmp_path / "artifacts")
    first = await cache.ensure_artifact("m", sha256=sha, source=f"{base}/m.gguf", size_mb=1)
    assert first.ok and first.reason == REASON_FETCHED and first.fetched
    assert Path(first.path).read_bytes() == data
    assert oct(os.stat(first.path).st_mode & 0o777) == "0o600"
    second = await cache.ensure_artifact("m", sha256=None, source=None, size_mb=None)
    assert second.ok and second.reason == REASON_CACHE_HIT and not second.fetched
    assert [e.model_id for e in cache.entries()] == ["m"]


async def test_wrong_digest_never_replaces_the_cache(tmp_path: Path, http_files):
    base, files = http_files
    good, sha = _blob(200_000, seed=1)
    evil, _ = _blob(200_000, seed=2)
    cache = ArtifactCache(tmp_path / "artifacts")
    files.blobs["/m.gguf"] = good
    assert (await cache.ensure_artifact("m", sha256=sha, source=f"{base}/m.gguf", size_mb=1)).ok
    # The source now serves different bytes under the same name. A refetch of the same digest
    # and a fetch under another digest both fail, and the published blob survives untouched.
    files.blobs["/m.gguf"] = evil
    same = await cache.fetch(f"{base}/m.gguf", sha, MIB, model_id="m")
    assert not same.ok and same.reason == REASON_DIGEST_MISMATCH
    other_sha = hashlib.sha256(b"x").hexdigest()
    outcome = await cache.fetch(f"{base}/m.gguf", other_sha, MIB, model_id="m2")
    assert not outcome.ok and outcome.reason == REASON_DIGEST_MISMATCH
    assert not cache.has_blob(other_sha)
    assert not cache.staging_path(other_sha).exists() and not cache.staging_path(sha).exists()
    assert cache.blob_path(sha).read_bytes() == good
    assert cache.lookup("m").sha256 == sha
    assert cache.lookup("m2") is None


async def test_size_ceiling_declared_and_streamed(tmp_path: Path, http_files):
    base, files = http_files
    data, sha = _blob(2 * MIB + 10)
    files.blobs["/big.gguf"] = data
    files.blobs["/big-chunked.gguf"] = data
    files.no_length.add("/big-chunked.gguf")
    cache = ArtifactCache(tmp_path / "artifacts")
    declared = await cache.ensure_artifact("big", sha256=sha, source=f"{base}/big.gguf", size_mb=1)
    assert not declared.ok and declared.reason == REASON_SIZE_CEILING
    streamed = await cache.ensure_artifact("big", sha256=sha, source=f"{base}/big-chunked.gguf", size_mb=1)
    assert not streamed.ok and streamed.reason == REASON_SIZE_CEILING
    assert not cache.has_blob(sha) and not cache.staging_path(sha).exists()


async def test_interrupted_transfer_resumes_with_range(tmp_path: Path, http_files):
    base, files = http_files
    data, sha = _blob(1_000_000, seed=3)
    files.blobs["/r.gguf"] = data
    files.cut_after = 400_000
    cache = ArtifactCache(tmp_path / "artifacts")
    broken = await cache.ensure_artifact("r", sha256=sha, source=f"{base}/r.gguf", size_mb=1)
    assert not broken.ok
    partial = cache.staging_path(sha)
    assert partial.exists() and 0 < partial.stat().st_size < len(data)
    resumed = await cache.ensure_artifact("r", sha256=sha, source=f"{base}/r.gguf", size_mb=1)
    assert resumed.ok and resumed.fetched
    assert files.ranges[-1] == f"bytes={partial.stat().st_size if partial.exists() else 400_000}-"
    assert Path(resumed.path).read_bytes() == data


async def test_missing_source_fields_and_offline_hub(tmp_path: Path):
    cache = ArtifactCache(tmp_path / "artifacts", allow_hub_fetch=False)
    sha = "a" * 64
    none = await cache.ensure_artifact("x", sha256=sha, source=None, size_mb=None)
    assert none.reason == REASON_NOT_CACHED
    incomplete = await cache.ensure_artifact("x", sha256=None, source="hf://o/r/x.gguf", size_mb=10)
    assert incomplete.reason == REASON_SOURCE_INCOMPLETE
    hub = await cache.ensure_artifact("x", sha256=sha, source="hf://o/r/x.gguf", size_mb=10)
    assert not hub.ok and hub.reason == REASON_HUB_OFFLINE and "offline" in hub.message


async def test_load_command_reports_real_fetch_only(js_log: JetStreamLog, start_agent, http_files, grid_config):
    base, files = http_files
    data, sha = _blob(500_000, seed=4)
    files.blobs["/a.gguf"] = data
    src = grid_config.home / "src.gguf"
    src.write_bytes(data)
    await start_agent()
    kw = dict(artifact_sha256=sha, artifact_size_mb=1)
    await js_log.append(make_command("l1", "load", model_id="a", artifact_source=f"{base}/a.gguf", **kw))
    await js_log.append(make_command("l2", "load", model_id="a", artifact_source=f"{base}/a.gguf", **kw))
    await js_log.append(make_command("l3", "load", model_id="b", artifact_source=f"file://{src}", **kw))
    await js_log.append(make_command("l4", "load", model_id="big", artifact_source=f"{base}/a.gguf",
                                     artifact_sha256=hashlib.sha256(b"other").hexdigest(), artifact_size_mb=1))
    a1, a2, a3, a4 = [await wait_ack(js_log, f"l{i}") for i in range(1, 5)]
    assert (a1.status, a1.artifact_fetched) == ("succeeded", True)
    assert (a2.status, a2.message, a2.artifact_fetched) == ("succeeded", REASON_CACHE_HIT, False)
    assert (a3.status, a3.artifact_fetched) == ("succeeded", False)  # same bytes: already cached by digest
    assert a4.status == "failed" and a4.message.startswith(REASON_DIGEST_MISMATCH) and not a4.artifact_fetched


async def test_file_sources_only_from_allowed_directories_and_acks_describe_nothing(
        js_log: JetStreamLog, start_agent, grid_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # A load naming a file the host never offered (a forged or mistaken command) reads nothing and
    # says nothing about it: not whether it exists, not its digest.
    allowed = tmp_path / "models"
    allowed.mkdir()
    secret = tmp_path / "private.gguf"
    secret.write_bytes(b"not for the grid")
    data, sha = _blob(200_000, seed=9)
    (allowed / "ok.gguf").write_bytes(data)
    (allowed / "escape.gguf").symlink_to(secret)
    monkeypatch.setenv(FILE_ROOTS_ENV, str(allowed))
    await start_agent()
    kw = dict(artifact_size_mb=1)
    bad_sha = hashlib.sha256(b"not for the grid").hexdigest()
    await js_log.append(make_command("f1", "load", model_id="p", artifact_source=f"file://{secret}",
                                     artifact_sha256=bad_sha, **kw))
    await js_log.append(make_command("f2", "load", model_id="q", artifact_source=f"file://{allowed}/escape.gguf",
                                     artifact_sha256=bad_sha, **kw))
    await js_log.append(make_command("f3", "load", model_id="r", artifact_source=f"file://{allowed}/ok.gguf",
                                     artifact_sha256="0" * 64, **kw))
    await js_log.append(make_command("f4", "load", model_id="s", artifact_source=f"file://{allowed}/ok.gguf",
                                     artifact_sha256=sha, **kw))
    f1, f2, f3, f4 = [await wait_ack(js_log, f"f{i}") for i in range(1, 5)]
    for ack in (f1, f2):
        assert ack.status == "failed" and ack.message.startswith(REASON_SOURCE_NOT_ALLOWED)
        assert "private" not in ack.message and bad_sha[:8] not in ack.message
    assert f3.status == "failed" and f3.message.startswith(REASON_DIGEST_MISMATCH) and sha[:12] not in f3.message
    assert f4.status == "succeeded" and f4.artifact_fetched
    assert ArtifactCache(grid_config.artifacts_dir).lookup("p") is None


async def test_one_side_effect_at_a_time_heartbeats_stay_responsive(js_log: JetStreamLog, start_agent, http_files):
    base, files = http_files
    data, sha = _blob(640 * 1024, seed=5)
    files.blobs["/slow.gguf"] = data
    files.trickle = 0.25  # ten chunks: about 2.5 s of transfer
    await start_agent()
    await js_log.append(make_command("slow", "load", model_id="slow", artifact_source=f"{base}/slow.gguf",
                                     artifact_sha256=sha, artifact_size_mb=1))
    await js_log.append(make_command("queued", "drain", model_id="other"))
    await js_log.append(make_command("queued-2", "drain", model_id="other"))

    async def loading():
        hbs = await heartbeats(js_log)
        return any(r.state == "loading" for r in hbs[-1].residencies) if hbs else False

    await wait_for(loading, timeout=10, interval=0.05)
    before = len(await heartbeats(js_log))
    await js_log.append(CommandWithdrawn(event_id="wd", at=0.0, action_id="queued", host_id=HOST, reason="replanned"))
    ack = await wait_ack(js_log, "queued")
    assert ack.status == "cancelled" and ack.message == "withdrawn: replanned"
    # The withdrawal was handled while the load still ran: heartbeats kept flowing too.
    assert not await terminal_acks(js_log, "slow")
    slow = await wait_ack(js_log, "slow", timeout=30)
    assert slow.status == "succeeded" and slow.artifact_fetched and slow.duration_seconds > 1.0
    assert len(await heartbeats(js_log)) - before >= 3
    second = await wait_ack(js_log, "queued-2")
    assert second.status == "succeeded"
    assert len(await terminal_acks(js_log, "queued")) == 1
