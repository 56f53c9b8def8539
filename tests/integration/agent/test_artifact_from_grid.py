"""A load whose profile names no source: the agent fetches the artifact from the grid's store."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from grid.agent.artifacts import REASON_NOT_CACHED, ArtifactCache
from grid.config import GridConfig
from grid.transport.artifact_store import put_artifact
from grid.transport.jetstream import JetStreamLog
from tests.artifact_store import fresh_artifact_bucket
from tests.integration.agent.agentkit import make_command, wait_ack


async def test_load_fetches_from_the_grid_when_no_source_is_named(js_log: JetStreamLog, start_agent,
                                                                  grid_config: GridConfig, tmp_path: Path) -> None:
    js = await fresh_artifact_bucket(js_log)
    data = os.urandom(1_300_000)
    sha = hashlib.sha256(data).hexdigest()
    blob = tmp_path / "pushed.gguf"
    blob.write_bytes(data)
    await put_artifact(js, blob, sha)
    await start_agent()

    await js_log.append(make_command("g1", "load", model_id="pushed", artifact_sha256=sha, artifact_size_mb=2))
    await js_log.append(make_command("g2", "load", model_id="again", artifact_sha256=sha, artifact_size_mb=2))
    missing = hashlib.sha256(b"never pushed").hexdigest()
    await js_log.append(make_command("g3", "load", model_id="absent", artifact_sha256=missing, artifact_size_mb=2))
    first, second, absent = [await wait_ack(js_log, a) for a in ("g1", "g2", "g3")]

    assert (first.status, first.artifact_fetched) == ("succeeded", True)
    assert (second.status, second.artifact_fetched) == ("succeeded", False)  # cached by digest now
    assert absent.status == "failed" and absent.message.startswith(REASON_NOT_CACHED), absent.message
    assert "not in the grid's artifact store" in absent.message
    cache = ArtifactCache(grid_config.artifacts_dir)
    assert cache.blob_path(sha).read_bytes() == data
    assert not cache.staging_path(missing).exists()
