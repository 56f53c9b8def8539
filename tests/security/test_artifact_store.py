"""The artifact store's permissions, tried with real credentials on a secured nats-server: the
operator puts, a host reads (stream message gets) but can neither put, delete, purge nor open a consumer
on the bucket, and whatever it tries leaves the stored object as it was."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js.object_store import ObjectStore

from grid.events.subjects import ARTIFACT_BUCKET, ARTIFACT_STREAM, artifact_chunk_subject, artifact_meta_subject
from grid.identity.permissions import IMPORTED_JS_PREFIX, Role
from grid.transport.artifact_store import (
    ARTIFACT_CHUNK_SIZE,
    REASON_ALREADY_STORED,
    REASON_STORED,
    ArtifactStoreError,
    ensure_artifact_bucket,
    put_artifact,
    read_chunks,
    stored_artifact,
)
from grid.transport.jetstream import JetStreamLog
from tests.artifact_store import fresh_artifact_bucket
from tests.security.conftest import CredsFactory, SecuredNats, raw_client

HOST = "node-1"
REFUSAL_WAIT_SECONDS = 2.0


@pytest.fixture
async def bucket(controller_log: JetStreamLog) -> AsyncIterator[JetStreamLog]:
    js = await fresh_artifact_bucket(controller_log)
    await ensure_artifact_bucket(js)  # idempotent
    yield controller_log


def _blob(tmp_path: Path, size: int, name: str = "blob.gguf") -> tuple[Path, str]:
    data = os.urandom(size)
    path = tmp_path / name
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


async def _read_all(js: nats.js.JetStreamContext, sha: str) -> bytes:
    stored = await stored_artifact(js, sha)
    assert stored is not None
    return b"".join([data async for _, data in read_chunks(js, stored)])


async def test_operator_puts_once_and_a_host_reads(bucket: JetStreamLog, secured_server: SecuredNats,
                                                   creds: CredsFactory, tmp_path: Path) -> None:
    path, sha = _blob(tmp_path, 3 * ARTIFACT_CHUNK_SIZE + 12345)
    operator = await raw_client(secured_server, creds(Role.OPERATOR))
    host = await raw_client(secured_server, creds(Role.HOST, host_id=HOST))
    try:
        seen: list[int] = []
        first = await put_artifact(operator.jetstream(prefix=IMPORTED_JS_PREFIX), path, sha, progress=lambda done, total: seen.append(done))
        assert (first.reason, first.size) == (REASON_STORED, path.stat().st_size)
        assert seen and seen[-1] == path.stat().st_size
        last_seq = (await bucket.client.jetstream().stream_info(ARTIFACT_STREAM)).state.last_seq
        again = await put_artifact(operator.jetstream(prefix=IMPORTED_JS_PREFIX), path, sha)
        assert again.reason == REASON_ALREADY_STORED
        # Idempotent: the second push stored nothing.
        assert (await bucket.client.jetstream().stream_info(ARTIFACT_STREAM)).state.last_seq == last_seq
        stored = await stored_artifact(host.jetstream(prefix=IMPORTED_JS_PREFIX), sha)
        assert stored is not None and stored.digest_matches and stored.chunks == 4
        assert await _read_all(host.jetstream(prefix=IMPORTED_JS_PREFIX), sha) == path.read_bytes()
        assert await stored_artifact(host.jetstream(prefix=IMPORTED_JS_PREFIX), "0" * 64) is None
        assert not host.permission_errors  # type: ignore[attr-defined]
    finally:
        await operator.close()
        await host.close()


async def test_a_host_cannot_put_delete_purge_or_consume(bucket: JetStreamLog, secured_server: SecuredNats,
                                                         creds: CredsFactory, tmp_path: Path) -> None:
    path, sha = _blob(tmp_path, ARTIFACT_CHUNK_SIZE + 7)
    other, other_sha = _blob(tmp_path, 1000, "other.gguf")
    operator = await raw_client(secured_server, creds(Role.OPERATOR))
    host = await raw_client(secured_server, creds(Role.HOST, host_id=HOST))
    admin = bucket.client.jetstream()
    try:
        await put_artifact(operator.jetstream(prefix=IMPORTED_JS_PREFIX), path, sha)
        before = (await admin.stream_info(ARTIFACT_STREAM)).state
        hjs = host.jetstream(prefix=IMPORTED_JS_PREFIX, timeout=REFUSAL_WAIT_SECONDS)
        stored = await stored_artifact(hjs, sha)
        assert stored is not None

        with pytest.raises(ArtifactStoreError):
            await put_artifact(hjs, other, other_sha)
        with pytest.raises((nats.errors.Error, asyncio.TimeoutError)):
            await ObjectStore(ARTIFACT_BUCKET, ARTIFACT_STREAM, hjs).delete(sha)
        # The raw forms of the same attempts: overwrite the metadata (a delete is one), add a
        # chunk to the object, purge the bucket, and open a consumer (whose deliver subject
        # could be anything).
        for subject in (artifact_meta_subject(sha), artifact_chunk_subject(stored.nuid)):
            with pytest.raises((nats.errors.Error, asyncio.TimeoutError)):
                await hjs.publish(subject, b'{"deleted": true}', timeout=REFUSAL_WAIT_SECONDS)
        with pytest.raises((nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError)):
            await hjs.purge_stream(ARTIFACT_STREAM)
        with pytest.raises((nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError)):
            await hjs.subscribe(artifact_chunk_subject(stored.nuid), ordered_consumer=True)
        await asyncio.sleep(0.2)
        assert any("permissions violation" in str(e).lower()
                   for e in host.permission_errors)  # type: ignore[attr-defined]

        after = (await admin.stream_info(ARTIFACT_STREAM)).state
        assert (after.messages, after.last_seq) == (before.messages, before.last_seq)
        assert await stored_artifact(admin, other_sha) is None
        # ... and the host still reads the object, intact.
        assert await _read_all(hjs, sha) == path.read_bytes()
    finally:
        await operator.close()
        await host.close()


async def test_gateway_and_reader_cannot_read_the_store(bucket: JetStreamLog, secured_server: SecuredNats,
                                                        creds: CredsFactory, tmp_path: Path) -> None:
    path, sha = _blob(tmp_path, 1000)
    operator = await raw_client(secured_server, creds(Role.OPERATOR))
    gateway = await raw_client(secured_server, creds(Role.GATEWAY))
    try:
        await put_artifact(operator.jetstream(prefix=IMPORTED_JS_PREFIX), path, sha)
        with pytest.raises(ArtifactStoreError):
            await stored_artifact(gateway.jetstream(prefix=IMPORTED_JS_PREFIX), sha, timeout=REFUSAL_WAIT_SECONDS)
    finally:
        await operator.close()
        await gateway.close()


async def test_an_operator_push_replaces_a_corrupt_object(bucket: JetStreamLog, secured_server: SecuredNats,
                                                          creds: CredsFactory, tmp_path: Path) -> None:
    path, sha = _blob(tmp_path, ARTIFACT_CHUNK_SIZE + 99)
    admin = bucket.client.jetstream()
    await ObjectStore(ARTIFACT_BUCKET, ARTIFACT_STREAM, admin).put(sha, os.urandom(5000))  # wrong bytes
    assert not (await stored_artifact(admin, sha)).digest_matches
    operator = await raw_client(secured_server, creds(Role.OPERATOR))
    host = await raw_client(secured_server, creds(Role.HOST, host_id=HOST))
    try:
        # The operator may not purge the old chunks (only the controller may), yet the push stands.
        result = await put_artifact(operator.jetstream(prefix=IMPORTED_JS_PREFIX, timeout=REFUSAL_WAIT_SECONDS), path, sha)
        assert (result.reason, result.size) == (REASON_STORED, path.stat().st_size)
        stored = await stored_artifact(host.jetstream(prefix=IMPORTED_JS_PREFIX), sha)
        assert stored is not None and stored.digest_matches
        assert await _read_all(host.jetstream(prefix=IMPORTED_JS_PREFIX), sha) == path.read_bytes()
    finally:
        await operator.close()
        await host.close()
