"""The grid's artifact store, made anew for one test (no artifact of an earlier test in it)."""

from __future__ import annotations

import contextlib
from typing import Any

import nats.js.errors

from grid.events.subjects import ARTIFACT_BUCKET
from grid.transport.artifact_store import ensure_artifact_bucket
from grid.transport.jetstream import JetStreamLog


async def fresh_artifact_bucket(log: JetStreamLog) -> Any:
    """Delete the artifact bucket if it exists and create it empty; returns the log's JetStream
    context."""
    js = log.client.jetstream()
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_object_store(ARTIFACT_BUCKET)
    await ensure_artifact_bucket(js)
    return js
