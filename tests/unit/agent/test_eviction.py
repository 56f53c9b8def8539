"""Provenance in the artifact index and the rules an evict obeys, on real files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
from msgspec import UNSET

from grid.agent import eviction
from grid.agent.artifacts import ArtifactCache
from grid.agent.heartbeat import cached_reports
from grid.agent.outcomes import (
    MSG_EVICT_ARTIFACT_IN_USE,
    MSG_EVICT_MODEL_ACTIVE,
    MSG_EVICT_NEEDS_SHA256,
    MSG_EVICT_NOT_PREDICTIVE,
    MSG_EVICT_PINNED,
    MSG_EVICT_SHA256_DIFFERS,
    MSG_EVICT_UNKNOWN_PROVENANCE,
)
from grid.agent.state import ProcessProof, ResidencyRecord


class Clock:
    def __init__(self, now: float) -> None:
        self.t = now

    def __call__(self) -> float:
        return self.t


def _cache(tmp_path: Path, clock: Clock) -> ArtifactCache:
    cache = ArtifactCache(tmp_path / "artifacts")
    cache.now = clock
    cache.ensure()
    return cache


def _put(cache: ArtifactCache, model_id: str, data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    cache.blob_path(sha).write_bytes(data)
    cache.register(model_id, sha, len(data), "https://example.invalid/m.gguf")
    return sha


def _evict(cache: ArtifactCache, model_id: str, sha: str):  # type: ignore[no-untyped-def]
    return cache.evict(model_id, sha, lambda entry, index: eviction.index_refusal(model_id, sha, entry, index))


def test_a_prefetch_is_marked_with_its_time_and_a_use_clears_it_for_good(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    cache = _cache(tmp_path, clock)
    sha = _put(cache, "m", b"weights")
    entry = cache.lookup("m")
    assert entry is not None and not entry.predictive and entry.added_at == 1000.0
    clock.t = 1010.0
    assert cache.set_predictive("m", sha, True)
    entry = cache.lookup("m")
    assert entry is not None and entry.predictive and entry.added_at == 1010.0
    assert not cache.set_predictive("m", "0" * 64, False)  # another SHA is another artifact
    assert not cache.set_predictive("absent", sha, True)
    # A new reader (an agent restarted) sees the mark: it lives in the index file.
    assert ArtifactCache(cache.root).lookup("m").predictive  # type: ignore[union-attr]
    assert cache.set_predictive("m", sha, False)
    assert not cache.lookup("m").predictive  # type: ignore[union-attr]
    # Verifying or re-registering the same blob does not bring the mark back.
    assert cache.verify_cached("m", sha).ok
    cache.register("m", sha, len(b"weights"))
    assert not cache.lookup("m").predictive  # type: ignore[union-attr]


def test_the_heartbeat_reports_provenance_and_a_clamped_age(tmp_path: Path) -> None:
    clock = Clock(500.0)
    cache = _cache(tmp_path, clock)
    sha = _put(cache, "p", b"predicted")
    cache.set_predictive("p", sha, True)
    _put(cache, "o", b"operator")
    index = cache.read_index()
    index["old"] = msgspec.structs.replace(index["o"], model_id="old", added_at=0.0)  # an entry from before ages
    cache._write_index(index)
    reports = {c.model_id: c for c in cached_reports(cache.entries(), 530.0)}
    assert (reports["p"].predictive, reports["p"].cached_age_seconds) == (True, 30.0)
    assert (reports["o"].predictive, reports["o"].cached_age_seconds) == (False, 30.0)
    assert reports["old"].cached_age_seconds is UNSET
    behind = {c.model_id: c for c in cached_reports(cache.entries(), 400.0)}  # the clock stepped back
    assert behind["p"].cached_age_seconds == 0.0


def test_evict_deletes_exactly_an_unused_predictive_download(tmp_path: Path) -> None:
    cache = _cache(tmp_path, Clock(1.0))
    sha = _put(cache, "p", b"x" * 4096)
    keep = _put(cache, "o", b"y" * 100)
    cache.set_predictive("p", sha, True)
    result = _evict(cache, "p", sha)
    assert (result.deleted, result.refusal, result.reclaimed_bytes) == (True, "", 4096)
    assert not cache.has_blob(sha) and cache.lookup("p") is None
    assert cache.has_blob(keep) and cache.lookup("o") is not None
    again = _evict(cache, "p", sha)
    assert again.absent and not again.deleted and again.reclaimed_bytes == 0


def test_evict_refuses_everything_else_and_deletes_nothing(tmp_path: Path) -> None:
    cache = _cache(tmp_path, Clock(1.0))
    op = _put(cache, "operator", b"operator's own")
    used = _put(cache, "used", b"used download")
    cache.set_predictive("used", used, True)
    cache.set_predictive("used", used, False)
    pinned = _put(cache, "pinned", b"pinned download")
    cache.set_predictive("pinned", pinned, True)
    index = cache.read_index()
    index["pinned"].pinned = True
    shared = _put(cache, "shared-a", b"one blob, two ids")
    cache.register("shared-b", shared, len(b"one blob, two ids"))
    index = {**index, **{k: v for k, v in cache.read_index().items() if k.startswith("shared")}}
    index["shared-a"].predictive = True
    cache._write_index(index)
    p = _put(cache, "p", b"predicted")
    cache.set_predictive("p", p, True)
    stray = hashlib.sha256(b"stray").hexdigest()
    cache.blob_path(stray).write_bytes(b"stray")

    cases = [
        ("operator", op, MSG_EVICT_NOT_PREDICTIVE),
        ("used", used, MSG_EVICT_NOT_PREDICTIVE),
        ("pinned", pinned, MSG_EVICT_PINNED),
        ("shared-a", shared, MSG_EVICT_ARTIFACT_IN_USE),
        ("p", op, MSG_EVICT_SHA256_DIFFERS),
        ("unindexed", stray, MSG_EVICT_UNKNOWN_PROVENANCE),
    ]
    before = sorted(path.name for path in cache.blobs.iterdir())
    for model_id, sha, reason in cases:
        result = _evict(cache, model_id, sha)
        assert not result.deleted and result.refusal.startswith(reason), (model_id, result)
    assert sorted(path.name for path in cache.blobs.iterdir()) == before
    assert set(cache.read_index()) == {"operator", "used", "pinned", "shared-a", "shared-b", "p"}


def test_a_damaged_index_leaves_nothing_evictable(tmp_path: Path) -> None:
    cache = _cache(tmp_path, Clock(1.0))
    sha = _put(cache, "p", b"predicted")
    cache.set_predictive("p", sha, True)
    cache.index_path.write_bytes(b"{not json")
    assert cache.entries() == []
    result = _evict(cache, "p", sha)
    assert not result.deleted and result.refusal.startswith(MSG_EVICT_UNKNOWN_PROVENANCE)
    assert cache.has_blob(sha)
    # The index rebuilds as the cache always did, and the rebuilt entry is the operator's.
    assert cache.verify_cached("p", sha).ok
    assert not cache.lookup("p").predictive  # type: ignore[union-attr]


def test_the_command_must_name_an_exact_sha() -> None:
    assert eviction.exact_sha256(None)[1].startswith(MSG_EVICT_NEEDS_SHA256)
    assert eviction.exact_sha256("abc")[1].startswith(MSG_EVICT_NEEDS_SHA256)
    digest, why = eviction.exact_sha256("A" * 64)
    assert (digest, why) == ("a" * 64, "")


def test_an_active_model_or_blob_is_never_evicted() -> None:
    sha = "a" * 64
    proof = ProcessProof(pid=1, port=9)
    for state in ("loading", "warming", "ready", "draining", "unloading", "failed"):
        recs = {"m": ResidencyRecord(model_id="m", state=state, artifact_sha256=sha)}
        assert eviction.residency_refusal("m", sha, recs, ()).startswith(MSG_EVICT_MODEL_ACTIVE), state
    cached = {"m": ResidencyRecord(model_id="m", state="cached", artifact_sha256=sha)}
    assert eviction.residency_refusal("m", sha, cached, ()) == ""
    assert eviction.residency_refusal("m", sha, {}, ()) == ""
    held = {"m": ResidencyRecord(model_id="m", state="cached", artifact_sha256=sha, process=proof)}
    assert eviction.residency_refusal("m", sha, held, ()).startswith(MSG_EVICT_MODEL_ACTIVE)
    assert eviction.residency_refusal("m", sha, {}, ("m",)).startswith(MSG_EVICT_MODEL_ACTIVE)
    other = {"n": ResidencyRecord(model_id="n", state="ready", artifact_sha256=sha)}
    assert eviction.residency_refusal("m", sha, other, ()).startswith(MSG_EVICT_ARTIFACT_IN_USE)
