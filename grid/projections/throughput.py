"""Measured per-engine throughput: output tokens/s per (host, model, artifact revision).

Folded from the gateway's request telemetry (``RequestCompleted`` and ``RequestBatch``): each
successful text generation that names the host and model that served it, with output tokens and
a service time, is one sample ``output_units / service_seconds``. These are the server-owned
measurements the seed says override self-reported estimates in placement; a heartbeat can never
write them.

* An eight-sample EWMA, authoritative after four samples (the same rule as learned load and warm
  timings), so one lucky request cannot move a replica.
* Keyed by the artifact sha256 the route served: a replacement artifact starts with no evidence
  and a late response from the previous revision cannot update the new one.
* Invalid reports are ignored rather than poisoning placement: not ``ok``, not text generation,
  no host or model, no tokens, a service time that is non-finite, negative, zero or over an
  hour, or a rate that is not finite or above :data:`MAX_TOKENS_PER_SECOND`.
* Bounded: only configured models, at most :data:`MAX_ENTRIES` keys (the least recently updated
  is dropped first), and a record not refreshed for 30 days restarts from its next sample and
  is not reported (a runtime or hardware upgrade relearns).

The fold mutates and returns ``state`` (a request batch holds up to 512 records); it performs
no I/O and depends only on its inputs and the log receipt time. ``measured`` is pure.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping

import msgspec

from grid.events.base import Event
from grid.events.control import ModelProfile
from grid.events.requests import RequestBatch, RequestCompleted, RequestFeatures
from grid.fleet import AUTHORITATIVE_SAMPLES
from grid.projections.position import Position

ALPHA = 2.0 / (8 + 1)
MAX_AGE_SECONDS = 30 * 86_400.0
MAX_SERVICE_SECONDS = 3600.0
MAX_TOKENS_PER_SECOND = 1_000_000.0
MAX_ENTRIES = 4096
_SAMPLES_CAP = 1 << 30
# Endpoints whose output units are generated tokens.
TEXT_ENDPOINTS = frozenset({"chat", "completions"})
_SEP = "\x1f"


class Throughput(msgspec.Struct, kw_only=True, array_like=True):
    """One (host, model, revision): mutated in place by the fold."""

    host_id: str
    model_id: str
    artifact_sha256: str  # "" when the route named no revision
    ewma_tps: float
    samples: int
    updated_at: float


class ThroughputState(msgspec.Struct, kw_only=True):
    entries: dict[str, Throughput] = {}
    # Samples refused as invalid (a count only).
    ignored: int = 0


def initial() -> ThroughputState:
    return ThroughputState()


def key(host_id: str, model_id: str, sha: str) -> str:
    return f"{host_id}{_SEP}{model_id}{_SEP}{sha}"


def sample_tps(r: RequestFeatures) -> float | None:
    """Output tokens/s of one request record, or None when it is not a valid sample."""
    if r.outcome != "ok" or r.endpoint not in TEXT_ENDPOINTS or r.modality != "text":
        return None
    if not r.host_id or not r.served_model:
        return None
    s = r.service_seconds
    if not (math.isfinite(s) and 0.0 < s <= MAX_SERVICE_SECONDS) or r.output_units <= 0:
        return None
    tps = r.output_units / s
    if not (math.isfinite(tps) and 0.0 < tps <= MAX_TOKENS_PER_SECOND):
        return None
    return tps


def _evict(entries: dict[str, Throughput]) -> None:
    oldest = min(entries, key=lambda k: (entries[k].updated_at, k))
    del entries[oldest]


def record_request(state: ThroughputState, r: RequestFeatures, at: float, configured: Container[str]) -> None:
    """Fold one record received at ``at`` (mutates ``state``)."""
    if r.served_model is None or r.served_model not in configured:
        return
    tps = sample_tps(r)
    if tps is None:
        state.ignored += 1
        return
    sha = (r.artifact_sha256 or "").lower()
    k = key(r.host_id or "", r.served_model, sha)
    entries = state.entries
    old = entries.get(k)
    if old is None or at - old.updated_at > MAX_AGE_SECONDS:
        if old is None and len(entries) >= MAX_ENTRIES:
            _evict(entries)
        entries[k] = Throughput(host_id=r.host_id or "", model_id=r.served_model, artifact_sha256=sha,
                                ewma_tps=tps, samples=1, updated_at=at)
        return
    old.ewma_tps += ALPHA * (tps - old.ewma_tps)
    old.samples = min(old.samples + 1, _SAMPLES_CAP)
    if at > old.updated_at:
        old.updated_at = at


def apply(state: ThroughputState, event: Event, position: Position, configured: Container[str]) -> ThroughputState:
    """Fold one request event at its log receipt time (every other event leaves ``state`` as is)."""
    kind = type(event)
    if kind is RequestBatch:
        records: Iterable[RequestFeatures] = event.records  # type: ignore[attr-defined]
    elif kind is RequestCompleted:
        records = (event.features,)  # type: ignore[attr-defined]
    else:
        return state
    at = position.time
    if not math.isfinite(at):
        return state
    for r in records:
        record_request(state, r, at, configured)
    return state


def measured(state: ThroughputState, profiles: Iterable[ModelProfile], now: float) -> dict[str, dict[str, float]]:
    """host id -> model id -> authoritative tokens/s for the revision each profile configures.

    A profile with an artifact sha256 is scored only with evidence for exactly that revision
    (placement falls back to hardware priors until such evidence exists). A profile without one
    (external inventory) uses the most recently updated evidence for the model on that host.
    Records not refreshed within 30 days of ``now`` are not reported.
    """
    wanted: Mapping[str, str | None] = {
        p.model_id: (p.artifact_sha256.lower() if p.artifact_sha256 else None) for p in profiles
    }
    best: dict[tuple[str, str], Throughput] = {}
    for k in sorted(state.entries):
        t = state.entries[k]
        if t.model_id not in wanted or t.samples < AUTHORITATIVE_SAMPLES:
            continue
        if now - t.updated_at > MAX_AGE_SECONDS or not math.isfinite(t.ewma_tps) or t.ewma_tps <= 0.0:
            continue
        sha = wanted[t.model_id]
        if sha is not None and t.artifact_sha256 != sha:
            continue
        slot = (t.host_id, t.model_id)
        cur = best.get(slot)
        if cur is None or t.updated_at > cur.updated_at:
            best[slot] = t
    out: dict[str, dict[str, float]] = {}
    for (host, model), t in sorted(best.items()):
        out.setdefault(host, {})[model] = t.ewma_tps
    return out
