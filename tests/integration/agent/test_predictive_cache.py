"""Predictive prefetch and evict through the real log: a real agent downloads the real SmolLM2
GGUF from the grid's artifact store on a PREDICTIVE_PREFETCH load, reports it predictive with
an age, evicts exactly that download (disk reclaimed, entry gone), refuses everything else, and
fetches it again normally on a later real load."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256, BUNDLED_SIZE_BYTES, ArtifactCache
from grid.agent.engines.runtime import Runtime
from grid.agent.outcomes import (
    MSG_EVICT_MODEL_ACTIVE,
    MSG_EVICT_NEEDS_SHA256,
    MSG_EVICT_NOT_PREDICTIVE,
    MSG_EVICT_SHA256_DIFFERS,
    MSG_EVICTED,
)
from grid.cli.node import node_app
from grid.config import GridConfig
from grid.events.commands import PREDICTIVE_PREFETCH
from grid.events.host import CachedArtifact, HostHeartbeat
from grid.transport.artifact_store import put_artifact
from grid.transport.jetstream import JetStreamLog
from tests.artifact_store import fresh_artifact_bucket
from tests.integration.agent.agentkit import heartbeats, make_command, wait_ack, wait_for

runner = CliRunner()
OPERATOR_MODEL = "operator-model"
SMOL = dict(model_id=BUNDLED_MODEL_ID, artifact_sha256=BUNDLED_SHA256, artifact_size_mb=100, memory_mb=400)


@pytest.fixture
async def stored_smollm2(js_log: JetStreamLog, bundled_gguf: Path) -> AsyncIterator[None]:
    """The real GGUF in the grid's artifact store (what `gridctl model push` leaves)."""
    js = await fresh_artifact_bucket(js_log)
    await put_artifact(js, bundled_gguf, BUNDLED_SHA256)
    yield


def operator_cached(config: GridConfig) -> tuple[str, int]:
    """An artifact the operator put in this machine's cache (as `gridctl pull` does)."""
    cache = ArtifactCache(config.artifacts_dir)
    cache.ensure()
    data = os.urandom(300_000)
    sha = hashlib.sha256(data).hexdigest()
    cache.blob_path(sha).write_bytes(data)
    cache.register(OPERATOR_MODEL, sha, len(data))
    return sha, len(data)


def cached(hb: HostHeartbeat, model_id: str) -> CachedArtifact | None:
    return next((c for c in hb.cached if c.model_id == model_id), None)


async def heartbeat_after(log: JetStreamLog, at: float, check) -> HostHeartbeat:  # type: ignore[no-untyped-def]
    async def found() -> HostHeartbeat | None:
        hbs = [hb for hb in await heartbeats(log) if hb.at > at]
        return hbs[-1] if hbs and check(hbs[-1]) else None

    return await wait_for(found, timeout=30)


async def test_prefetch_is_reported_predictive_then_evicted_and_fetched_again(
        js_log: JetStreamLog, start_agent, grid_config: GridConfig, stored_smollm2: None) -> None:
    op_sha, _ = operator_cached(grid_config)
    agent = await start_agent()

    await js_log.append(make_command("prefetch", "load", reason=PREDICTIVE_PREFETCH, **SMOL))
    ack = await wait_ack(js_log, "prefetch", timeout=120)
    assert (ack.status, ack.artifact_fetched) == ("succeeded", True), ack
    # Cached, never warmed: no process, no memory.
    rec = agent.state.residencies[BUNDLED_MODEL_ID]
    assert rec.state == "cached" and rec.process is None
    hb = await heartbeat_after(js_log, ack.at, lambda h: cached(h, BUNDLED_MODEL_ID) is not None)
    entry = cached(hb, BUNDLED_MODEL_ID)
    assert entry is not None and entry.predictive and entry.sha256 == BUNDLED_SHA256
    assert isinstance(entry.cached_age_seconds, float) and 0.0 <= entry.cached_age_seconds < 120
    operator = cached(hb, OPERATOR_MODEL)
    assert operator is not None and not operator.predictive
    assert all(r.state == "cached" for r in hb.residencies if r.model_id == BUNDLED_MODEL_ID)
    # `gridctl node status` says which cached artifact is a prediction.
    shown = runner.invoke(node_app, ["status", "--json"])
    assert shown.exit_code == 0, shown.output
    rows = {r["model_id"]: r for r in json.loads(shown.output)["residencies"]}
    assert (rows[BUNDLED_MODEL_ID]["state"], rows[BUNDLED_MODEL_ID]["predictive"]) == ("cached", True)
    assert "cached (predictive)" in runner.invoke(node_app, ["status"], terminal_width=200).output

    # Refusals: an inexact SHA, no SHA at all, the operator's own cache. Nothing is deleted.
    await js_log.append(make_command("wrong-sha", "evict", model_id=BUNDLED_MODEL_ID, artifact_sha256=op_sha))
    await js_log.append(make_command("no-sha", "evict", model_id=BUNDLED_MODEL_ID))
    await js_log.append(make_command("operator", "evict", model_id=OPERATOR_MODEL, artifact_sha256=op_sha))
    wrong, none, operator_ack = [await wait_ack(js_log, a) for a in ("wrong-sha", "no-sha", "operator")]
    assert wrong.status == "failed" and wrong.message.startswith(MSG_EVICT_SHA256_DIFFERS), wrong
    assert none.status == "failed" and none.message.startswith(MSG_EVICT_NEEDS_SHA256), none
    assert operator_ack.status == "failed" and operator_ack.message.startswith(MSG_EVICT_NOT_PREDICTIVE), operator_ack
    cache = ArtifactCache(grid_config.artifacts_dir)
    assert cache.has_blob(BUNDLED_SHA256) and cache.has_blob(op_sha)

    before = (await heartbeats(js_log))[-1]
    await js_log.append(make_command("evict", "evict", model_id=BUNDLED_MODEL_ID, artifact_sha256=BUNDLED_SHA256))
    evicted = await wait_ack(js_log, "evict")
    assert evicted.status == "succeeded", evicted
    assert evicted.message == f"{MSG_EVICTED}: {BUNDLED_SIZE_BYTES} bytes reclaimed"
    assert not cache.has_blob(BUNDLED_SHA256) and cache.lookup(BUNDLED_MODEL_ID) is None
    assert BUNDLED_MODEL_ID not in agent.state.residencies
    after = await heartbeat_after(js_log, before.at, lambda h: cached(h, BUNDLED_MODEL_ID) is None)
    assert cached(after, OPERATOR_MODEL) is not None
    assert all(r.model_id != BUNDLED_MODEL_ID for r in after.residencies)
    assert before.disk_free_bytes is not None and after.disk_free_bytes is not None
    # Other writers share this disk: demand most of the file back, not the exact byte count.
    assert after.disk_free_bytes - before.disk_free_bytes > BUNDLED_SIZE_BYTES // 2

    # A later real load fetches it again, normally, and it is nobody's prediction.
    await js_log.append(make_command("reload", "load", **SMOL))
    reload = await wait_ack(js_log, "reload", timeout=120)
    assert (reload.status, reload.artifact_fetched) == ("succeeded", True), reload
    hb = await heartbeat_after(js_log, reload.at, lambda h: cached(h, BUNDLED_MODEL_ID) is not None)
    assert not cached(hb, BUNDLED_MODEL_ID).predictive  # type: ignore[union-attr]


async def test_provenance_survives_a_restart_and_a_cache_hit_is_not_a_prefetch(
        js_log: JetStreamLog, start_agent, grid_config: GridConfig, stored_smollm2: None) -> None:
    op_sha, _ = operator_cached(grid_config)
    agent = await start_agent()
    await js_log.append(make_command("prefetch", "load", reason=PREDICTIVE_PREFETCH, **SMOL))
    # The operator's artifact is already here: a prefetch of it downloads nothing and marks nothing.
    await js_log.append(make_command("prefetch-op", "load", reason=PREDICTIVE_PREFETCH, model_id=OPERATOR_MODEL,
                                     artifact_sha256=op_sha, artifact_size_mb=1))
    assert (await wait_ack(js_log, "prefetch", timeout=120)).artifact_fetched
    hit = await wait_ack(js_log, "prefetch-op")
    assert (hit.status, hit.artifact_fetched) == ("succeeded", False), hit
    await agent.stop(drain=True)

    restarted = time.time()
    agent = await start_agent()
    hb = await heartbeat_after(js_log, restarted, lambda h: cached(h, BUNDLED_MODEL_ID) is not None)
    assert cached(hb, BUNDLED_MODEL_ID).predictive  # type: ignore[union-attr]
    assert not cached(hb, OPERATOR_MODEL).predictive  # type: ignore[union-attr]
    await js_log.append(make_command("evict-op", "evict", model_id=OPERATOR_MODEL, artifact_sha256=op_sha))
    assert (await wait_ack(js_log, "evict-op")).message.startswith(MSG_EVICT_NOT_PREDICTIVE)
    await js_log.append(make_command("evict", "evict", model_id=BUNDLED_MODEL_ID, artifact_sha256=BUNDLED_SHA256))
    assert (await wait_ack(js_log, "evict")).message.startswith(MSG_EVICTED)


async def test_a_ready_model_is_never_evicted_and_a_warmed_prefetch_is_used_for_good(
        js_log: JetStreamLog, start_agent, grid_config: GridConfig, stored_smollm2: None,
        engine_runtime: Runtime) -> None:
    agent = await start_agent()
    await js_log.append(make_command("prefetch", "load", reason=PREDICTIVE_PREFETCH, **SMOL))
    assert (await wait_ack(js_log, "prefetch", timeout=120)).artifact_fetched
    await js_log.append(make_command("warm", "warm", dependencies=("prefetch",), **SMOL))
    warm = await wait_ack(js_log, "warm", timeout=90)
    assert (warm.status, warm.message) == ("succeeded", "ready"), warm

    await js_log.append(make_command("evict-ready", "evict", model_id=BUNDLED_MODEL_ID,
                                     artifact_sha256=BUNDLED_SHA256))
    refused = await wait_ack(js_log, "evict-ready")
    assert refused.status == "failed" and refused.message.startswith(MSG_EVICT_MODEL_ACTIVE), refused
    assert agent.state.residencies[BUNDLED_MODEL_ID].state == "ready"
    hb = await heartbeat_after(js_log, refused.at, lambda h: cached(h, BUNDLED_MODEL_ID) is not None)
    assert not cached(hb, BUNDLED_MODEL_ID).predictive  # type: ignore[union-attr]

    # Unloaded again, the download stays used: no evict takes it.
    await js_log.append(make_command("drain", "drain", model_id=BUNDLED_MODEL_ID))
    await js_log.append(make_command("unload", "unload", model_id=BUNDLED_MODEL_ID, dependencies=("drain",)))
    assert (await wait_ack(js_log, "unload", timeout=60)).status == "succeeded"
    await js_log.append(make_command("evict-used", "evict", model_id=BUNDLED_MODEL_ID,
                                     artifact_sha256=BUNDLED_SHA256))
    used = await wait_ack(js_log, "evict-used")
    assert used.status == "failed" and used.message.startswith(MSG_EVICT_NOT_PREDICTIVE), used
    assert ArtifactCache(grid_config.artifacts_dir).has_blob(BUNDLED_SHA256)
