"""The grid's artifact store: a JetStream object store bucket of model blobs named by sha256.

`gridctl model push` (and `gridctl pull smollm2` on the controller's machine) put a blob here;
a host that lacks an artifact its profile gives no other source for reads it from here
(grid.agent.artifact_fetch). The object's name is the blob's sha256 hex digest, so a name says
what the bytes must hash to, and the reader verifies it before anything is published.

Reading uses stream message gets only (`$JS.API.STREAM.MSG.GET.<stream>`), never a consumer
and never a direct get. A host may not create consumers: a push consumer's `deliver_subject` can
name any subject and the server checks no permission on it, so a host allowed to create one on
this bucket could replay object bytes onto another host's subjects. Nor may anyone but the
controller use direct gets: their answer is the stored message itself, delivered to whatever
reply subject the requester named (grid.identity.permissions). A message get answers with a JSON
envelope (the chunk base64-encoded inside) and is a plain request/reply: "the next message on
this object's chunk subject at or after stream sequence S". The sequence of the last chunk
written is therefore a resume point, and a window of such requests in flight keeps the link busy.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api
from nats.js.object_store import ObjectStore

from grid.events.subjects import (
    ARTIFACT_BUCKET,
    ARTIFACT_STREAM,
    artifact_chunk_subject,
    artifact_meta_subject,
)
from grid.transport.jetstream import JetStreamLog, StreamReplicas

# Below the server's default max_payload (1 MiB), also once base64-encoded in a message get's
# JSON answer (4/3 of it plus the envelope).
ARTIFACT_CHUNK_SIZE = 512 * 1024
# Message gets in flight while reading one object.
READ_WINDOW = 8
# JetStream API error codes of a message get.
JS_NO_MESSAGE = 10037
JS_STREAM_NOT_FOUND = 10059
REQUEST_TIMEOUT_SECONDS = 10.0

REASON_STORED = "stored"
REASON_ALREADY_STORED = "already_stored"

Progress = Callable[[int, int | None], None]


class _StoredMsg(msgspec.Struct):
    subject: str = ""
    seq: int = 0
    data: bytes = b""  # base64 in the JSON answer; msgspec decodes it


class _ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _MsgGetReply(msgspec.Struct):
    """The answer to `$JS.API.STREAM.MSG.GET.<stream>`: the message, or the reason there is none."""

    message: _StoredMsg | None = None
    error: _ApiError | None = None


_msg_get_decoder = msgspec.json.Decoder(_MsgGetReply)


class ArtifactStoreError(Exception):
    """The store could not be reached or answered something unusable (a connection problem,
    a missing bucket, a refused permission): the caller turns it into its own reason."""


class StoreMissing(ArtifactStoreError):
    """The grid has no artifact store (nothing answers for its stream)."""


class StoredArtifact(msgspec.Struct, frozen=True, kw_only=True):
    """What the store holds under one sha256: the object's size, chunk count and chunk subject."""

    sha256: str
    size: int
    chunks: int
    nuid: str
    # True when the object store's own digest (computed by whoever put it) is this sha256.
    digest_matches: bool


class PutResult(msgspec.Struct, frozen=True, kw_only=True):
    reason: str  # REASON_STORED | REASON_ALREADY_STORED
    sha256: str
    size: int


async def ensure_artifact_bucket(js: JetStreamContext, *, replicas: int = 1) -> None:
    """Create the artifact bucket if it is missing (idempotent). The one place it is created.

    Only the controller may create streams; everyone else reads or puts into the bucket it made.
    """
    config = api.ObjectStoreConfig(
        bucket=ARTIFACT_BUCKET,
        description="Grid model artifacts, one object per blob named by its sha256",
        storage=api.StorageType.FILE,
        replicas=replicas,
    )
    try:
        await js.stream_info(ARTIFACT_STREAM)
        return
    except nats.js.errors.NotFoundError:
        pass
    await js.create_object_store(ARTIFACT_BUCKET, config=config)



async def ensure_artifact_store(log: JetStreamLog) -> StreamReplicas:
    """The bucket on `log`'s server with the log's replica count (its setting, else automatic),
    an existing bucket's count updated where NATS allows it and reported with the fix if not."""
    js = log.client.jetstream()
    await log.create_replicated(lambda replicas: ensure_artifact_bucket(js, replicas=replicas))
    return await log.ensure_replicas(ARTIFACT_STREAM)

def _object_digest_hex(digest: str | None) -> str | None:
    # The object store writes "SHA-256=<base64url of the raw digest>".
    if not digest or "=" not in digest:
        return None
    prefix, _, value = digest.partition("=")
    if prefix.upper() != "SHA-256":
        return None
    try:
        return base64.urlsafe_b64decode(value).hex()
    except (binascii.Error, ValueError):
        return None


async def stored_artifact(js: JetStreamContext, sha256: str, *,
                          timeout: float = REQUEST_TIMEOUT_SECONDS) -> StoredArtifact | None:
    """The store's record of `sha256`, or None when it holds no such (undeleted) object."""
    subject = artifact_meta_subject(sha256)
    # The last message on the meta subject: no consumer.
    msg = await _message_get(js, {"last_by_subj": subject}, timeout=timeout)
    if msg is None:
        return None
    try:
        info: dict[str, Any] = json.loads(msg.data)
        if info.get("deleted"):
            return None
        if info.get("name") != sha256:
            raise ArtifactStoreError("artifact metadata names another object")
        size, chunks, nuid = int(info.get("size") or 0), int(info.get("chunks") or 0), str(info.get("nuid") or "")
        artifact_chunk_subject(nuid)  # validates the nuid before it is ever used in a subject
    except (ValueError, TypeError) as exc:
        raise ArtifactStoreError(f"unreadable artifact metadata: {type(exc).__name__}") from exc
    return StoredArtifact(sha256=sha256, size=size, chunks=chunks, nuid=nuid,
                          digest_matches=_object_digest_hex(info.get("digest")) == sha256)


async def _message_get(js: JetStreamContext, request: dict[str, Any], *,
                       timeout: float) -> _StoredMsg | None:
    """One `$JS.API.STREAM.MSG.GET` on the artifact stream; None when no message matches."""
    try:
        reply = await js._nc.request(f"{js._prefix}.STREAM.MSG.GET.{ARTIFACT_STREAM}",
                                     json.dumps(request).encode(), timeout=timeout)
    except nats.errors.NoRespondersError as exc:
        raise StoreMissing("the grid's server answers no JetStream request") from exc
    except (nats.errors.Error, OSError, asyncio.TimeoutError) as exc:
        raise ArtifactStoreError(f"artifact store unreachable: {type(exc).__name__}") from exc
    try:
        answer = _msg_get_decoder.decode(reply.data)
    except msgspec.DecodeError as exc:
        raise ArtifactStoreError("artifact store answered something that is not a message get reply") from exc
    if answer.error is not None:
        if answer.error.err_code == JS_NO_MESSAGE:
            return None
        if answer.error.err_code == JS_STREAM_NOT_FOUND:
            raise StoreMissing("the grid has no artifact store (the controller creates it at start)")
        raise ArtifactStoreError(f"artifact store answered {answer.error.code} {answer.error.description}")
    if answer.message is None:
        raise ArtifactStoreError("artifact store answered a message get without a message")
    return answer.message


async def read_chunks(js: JetStreamContext, artifact: StoredArtifact, *, after_seq: int = 0,
                      window: int = READ_WINDOW, timeout: float = REQUEST_TIMEOUT_SECONDS,
                      ) -> AsyncIterator[tuple[int, bytes]]:
    """Yield (stream sequence, bytes) of the object's chunks in order, starting after `after_seq`.

    Each round asks, for `window` consecutive sequences s, "the first chunk at or after s".
    Every chunk inside the round's range is the answer to the request at its own sequence, and
    answers grow with s, so reading them in request order and dropping repeats yields every
    chunk exactly once, whether or not another object's chunks are interleaved in the stream.
    """
    subject = artifact_chunk_subject(artifact.nuid)
    last = after_seq

    async def get(seq: int) -> _StoredMsg | None:
        return await _message_get(js, {"seq": seq, "next_by_subj": subject}, timeout=timeout)

    while True:
        try:
            replies = await asyncio.gather(*(get(last + 1 + i) for i in range(window)))
        except StoreMissing as exc:
            raise ArtifactStoreError(f"artifact read interrupted: {exc}") from exc
        progressed = False
        for reply in replies:
            if reply is None:
                break  # no chunk at or after this sequence: none after the later ones either
            if reply.subject != subject or reply.seq <= last:
                continue
            last = reply.seq
            progressed = True
            yield reply.seq, reply.data
        if not progressed:
            return


class _ProgressReader(io.RawIOBase):
    """A file whose reads report progress (the object store's put reads through `readinto`)."""

    def __init__(self, f: io.BufferedReader, total: int, progress: Progress | None) -> None:
        self._f, self._total, self._progress, self._done = f, total, progress, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._f.readinto(buffer)
        self._done += n or 0
        if self._progress is not None:
            self._progress(self._done, self._total)
        return n or 0


async def put_artifact(js: JetStreamContext, path: Path, sha256: str, *,
                       progress: Progress | None = None) -> PutResult:
    """Store the file at `path` under `sha256` (the caller hashed it), unless it is stored already.

    The object store computes its own digest while putting; if that is not `sha256` the file
    changed after it was hashed, and the caller is told so rather than left with a wrong object
    under a name that promises other bytes.
    """
    size = path.stat().st_size
    existing = await stored_artifact(js, sha256)
    if existing is not None and existing.size == size and existing.digest_matches:
        return PutResult(reason=REASON_ALREADY_STORED, sha256=sha256, size=size)
    store = ObjectStore(name=ARTIFACT_BUCKET, stream=ARTIFACT_STREAM, js=js)
    meta = api.ObjectMeta(name=sha256, options=api.ObjectMetaOptions(max_chunk_size=ARTIFACT_CHUNK_SIZE))
    try:
        with open(path, "rb") as f:
            info = await store.put(sha256, _ProgressReader(f, size, progress), meta=meta)  # type: ignore[arg-type]
    except (nats.errors.Error, OSError, asyncio.TimeoutError) as exc:
        # Replacing an object ends with a purge of its old chunks, which only the controller
        # may do: when that alone failed, the new object is whole and stored.
        stored = await stored_artifact(js, sha256)
        if stored is not None and stored.size == size and stored.digest_matches:
            return PutResult(reason=REASON_STORED, sha256=sha256, size=size)
        raise ArtifactStoreError(f"artifact put failed: {type(exc).__name__}: {str(exc)[:160]}") from exc
    if _object_digest_hex(info.digest) != sha256:
        raise ArtifactStoreError("the file changed while it was stored: its content no longer hashes to "
                                 f"{sha256[:12]}...; push it again")
    return PutResult(reason=REASON_STORED, sha256=sha256, size=int(info.size or 0))
