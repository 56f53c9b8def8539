"""A host fetches the real SmolLM2 GGUF from the grid's artifact store with its own (read-only)
credential on a secured nats-server: verified by sha256, published atomically, resumed after a
connection closed mid-transfer, size ceilings refused before a byte moves, corrupt objects refused
with nothing published and the partial removed."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.js.errors
import pytest
from nats.js import api
from nats.js.object_store import ObjectStore

from grid.agent.artifact_fetch import GridArtifactSource, resume_path
from grid.agent.artifacts import (
    BUNDLED_MODEL_ID,
    BUNDLED_SHA256,
    BUNDLED_SIZE_BYTES,
    MIB,
    REASON_DIGEST_MISMATCH,
    REASON_FETCHED,
    REASON_SIZE_CEILING,
    REASON_STORE_UNAVAILABLE,
    ArtifactCache,
)
from grid.events.subjects import ARTIFACT_BUCKET, ARTIFACT_STREAM, artifact_meta_subject
from grid.identity.permissions import IMPORTED_JS_PREFIX, Role
from grid.transport.artifact_store import put_artifact, stored_artifact
from grid.transport.jetstream import JetStreamLog
from tests.artifact_store import fresh_artifact_bucket
from tests.security.conftest import CredsFactory, SecuredNats, raw_client

HOST = "node-1"


@pytest.fixture
async def stored_model(controller_log: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory,
                       bundled_gguf: Path) -> AsyncIterator[JetStreamLog]:
    """A fresh bucket holding the bundled GGUF, put by the operator."""
    await fresh_artifact_bucket(controller_log)
    operator = await raw_client(secured_server, creds(Role.OPERATOR))
    try:
        await put_artifact(operator.jetstream(prefix=IMPORTED_JS_PREFIX), bundled_gguf, BUNDLED_SHA256)
    finally:
        await operator.close()
    yield controller_log


async def _host(server: SecuredNats, creds: CredsFactory) -> nats.NATS:
    return await raw_client(server, creds(Role.HOST, host_id=HOST))


async def test_a_host_fetches_verifies_and_publishes(stored_model: JetStreamLog, secured_server: SecuredNats,
                                                     creds: CredsFactory, tmp_path: Path) -> None:
    host = await _host(secured_server, creds)
    try:
        cache = ArtifactCache(tmp_path / "artifacts")
        cache.grid_source = GridArtifactSource(host.jetstream(prefix=IMPORTED_JS_PREFIX))
        outcome = await cache.ensure_artifact(BUNDLED_MODEL_ID, sha256=BUNDLED_SHA256, source=None, size_mb=None)
        assert outcome.ok and outcome.reason == REASON_FETCHED and outcome.fetched, outcome.message
        assert outcome.transferred_bytes == BUNDLED_SIZE_BYTES
        assert cache.verify_blob(BUNDLED_SHA256) and outcome.path == str(cache.blob_path(BUNDLED_SHA256))
        assert cache.lookup(BUNDLED_MODEL_ID).sha256 == BUNDLED_SHA256
        assert list(cache.staging.iterdir()) == []
        # A profile's size ceiling below the object's size is refused before a byte moves.
        small = ArtifactCache(tmp_path / "small")
        small.grid_source = GridArtifactSource(host.jetstream(prefix=IMPORTED_JS_PREFIX))
        refused = await small.ensure_artifact(BUNDLED_MODEL_ID, sha256=BUNDLED_SHA256, source=None, size_mb=50)
        assert (refused.ok, refused.reason, refused.transferred_bytes) == (False, REASON_SIZE_CEILING, 0)
        assert not small.has_blob(BUNDLED_SHA256) and not small.staging_path(BUNDLED_SHA256).exists()
    finally:
        await host.close()


async def test_an_interrupted_fetch_resumes_after_the_last_whole_chunk(
        stored_model: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory, tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path / "artifacts")
    host = await _host(secured_server, creds)
    cut_at = 40 * MIB
    closing: list[asyncio.Task[None]] = []

    def cut(done: int, total: int | None) -> None:
        # The connection really closes in the middle of the transfer (between two rounds of reads).
        if done >= cut_at and not closing:
            closing.append(asyncio.get_running_loop().create_task(host.close()))

    first = await GridArtifactSource(host.jetstream(prefix=IMPORTED_JS_PREFIX), checkpoint_bytes=4 * MIB).fetch(
        cache, BUNDLED_SHA256, None, model_id=BUNDLED_MODEL_ID, progress=cut)
    await asyncio.gather(*closing)
    assert not first.ok and first.reason == REASON_STORE_UNAVAILABLE, first.message
    assert cut_at <= first.transferred_bytes < BUNDLED_SIZE_BYTES
    partial = cache.staging_path(BUNDLED_SHA256)
    assert partial.exists() and resume_path(cache, BUNDLED_SHA256).exists()
    assert not cache.has_blob(BUNDLED_SHA256)
    kept = json.loads(resume_path(cache, BUNDLED_SHA256).read_bytes())["size"]
    assert kept == first.transferred_bytes  # every byte received was a whole chunk, and kept

    again = await _host(secured_server, creds)
    try:
        second = await GridArtifactSource(again.jetstream(prefix=IMPORTED_JS_PREFIX)).fetch(cache, BUNDLED_SHA256, None,
                                                                   model_id=BUNDLED_MODEL_ID)
    finally:
        await again.close()
    assert second.ok and second.fetched, second.message
    # The second attempt read only what the partial lacked.
    assert second.transferred_bytes == BUNDLED_SIZE_BYTES - kept
    assert cache.verify_blob(BUNDLED_SHA256)
    assert not partial.exists() and not resume_path(cache, BUNDLED_SHA256).exists()


async def _put_forged(js: nats.js.JetStreamContext, name: str, data: bytes, claimed_digest: bytes | None) -> None:
    """What a careless or hostile operator could store: `data` under `name`, optionally with
    metadata rewritten to claim the digest `claimed_digest`."""
    store = ObjectStore(ARTIFACT_BUCKET, ARTIFACT_STREAM, js)
    info = await store.put(name, data)
    if claimed_digest is not None:
        info.digest = "SHA-256=" + base64.urlsafe_b64encode(claimed_digest).decode()
        await js.publish(artifact_meta_subject(name), json.dumps(info.as_dict()).encode(),
                         headers={api.Header.ROLLUP: "sub"})


@pytest.mark.parametrize("forge_metadata", [False, True], ids=["honest-metadata", "forged-metadata"])
async def test_a_corrupt_object_is_refused_and_nothing_is_kept(
        stored_model: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory, tmp_path: Path,
        forge_metadata: bool) -> None:
    wanted = os.urandom(900_000)
    sha = hashlib.sha256(wanted).hexdigest()
    other = os.urandom(900_000)
    await _put_forged(stored_model.client.jetstream(), sha, other,
                      hashlib.sha256(wanted).digest() if forge_metadata else None)
    assert (await stored_artifact(stored_model.client.jetstream(), sha)).digest_matches is forge_metadata

    cache = ArtifactCache(tmp_path / "artifacts")
    cache.ensure()
    # A partial left by an earlier attempt goes too.
    cache.staging_path(sha).write_bytes(other[:1000])
    host = await _host(secured_server, creds)
    try:
        cache.grid_source = GridArtifactSource(host.jetstream(prefix=IMPORTED_JS_PREFIX))
        outcome = await cache.ensure_artifact("wanted", sha256=sha, source=None, size_mb=1)
    finally:
        await host.close()
    assert not outcome.ok and outcome.reason == REASON_DIGEST_MISMATCH, outcome.message
    assert not cache.has_blob(sha) and cache.lookup("wanted") is None
    assert not cache.staging_path(sha).exists() and not resume_path(cache, sha).exists()


async def test_an_object_larger_than_its_metadata_says_is_cut_off(
        stored_model: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory, tmp_path: Path) -> None:
    data = os.urandom(2 * 512 * 1024 + 10)
    sha = hashlib.sha256(data).hexdigest()
    js = stored_model.client.jetstream()
    info = await ObjectStore(ARTIFACT_BUCKET, ARTIFACT_STREAM, js).put(sha, data)
    info.size = 1000  # metadata understating the size: a ceiling checked only up front would pass it
    await js.publish(artifact_meta_subject(sha), json.dumps(info.as_dict()).encode(),
                     headers={api.Header.ROLLUP: "sub"})
    cache = ArtifactCache(tmp_path / "artifacts")
    host = await _host(secured_server, creds)
    try:
        cache.grid_source = GridArtifactSource(host.jetstream(prefix=IMPORTED_JS_PREFIX))
        outcome = await cache.ensure_artifact("liar", sha256=sha, source=None, size_mb=None)
    finally:
        await host.close()
    assert not outcome.ok and outcome.reason == REASON_SIZE_CEILING, outcome.message
    assert outcome.transferred_bytes == 0
    assert not cache.has_blob(sha) and not cache.staging_path(sha).exists() and not resume_path(cache, sha).exists()
