"""When an evict may delete a cached artifact: pure rules over the agent's residencies and the
cache index, each refusal with its reason (grid.agent.outcomes).

Only an exact, unused predictive download may go: the index must hold the commanded model with
exactly the commanded SHA-256, marked predictive (a predictive prefetch downloaded it and
nothing has used it since) and not pinned, and nothing on this host may be using the model or
the blob. Everything else (an operator's cache, a used download, an inexact or missing SHA, an
active model) is refused and nothing is deleted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from grid.agent.artifacts import IndexEntry, SourceError, normalize_sha256
from grid.agent.outcomes import (
    MSG_EVICT_ARTIFACT_IN_USE,
    MSG_EVICT_MODEL_ACTIVE,
    MSG_EVICT_NEEDS_SHA256,
    MSG_EVICT_NOT_PREDICTIVE,
    MSG_EVICT_PINNED,
    MSG_EVICT_SHA256_DIFFERS,
    MSG_EVICT_UNKNOWN_PROVENANCE,
)
from grid.agent.state import ResidencyRecord


def _short(sha256: str) -> str:
    return f"{sha256[:12]}..."


def exact_sha256(value: str | None) -> tuple[str | None, str]:
    """The commanded digest, or a refusal: an evict names exactly one blob."""
    if value is None:
        return None, f"{MSG_EVICT_NEEDS_SHA256}: the command names no artifact_sha256"
    try:
        digest = normalize_sha256(value)
    except SourceError as exc:
        return None, f"{MSG_EVICT_NEEDS_SHA256}: {exc}"
    return digest, ""


def residency_refusal(model_id: str, sha256: str, residencies: Mapping[str, ResidencyRecord],
                      external_models: Iterable[str]) -> str:
    """Refuse while this host runs the model (any state but a bare cached artifact), an engine
    Grid does not own serves that model id, or another residency is built on the same blob."""
    rec = residencies.get(model_id)
    if rec is not None and (rec.state != "cached" or rec.process is not None):
        return f"{MSG_EVICT_MODEL_ACTIVE}: {model_id} is {rec.state} on this host"
    if model_id in set(external_models):
        return f"{MSG_EVICT_MODEL_ACTIVE}: an engine Grid does not own serves {model_id} on this host"
    for other in sorted(residencies):
        r = residencies[other]
        if other != model_id and r.artifact_sha256 == sha256 and (r.state != "cached" or r.process is not None):
            return f"{MSG_EVICT_ARTIFACT_IN_USE}: {other} ({r.state}) runs on {_short(sha256)}"
    return ""


def index_refusal(model_id: str, sha256: str, entry: IndexEntry | None, index: Mapping[str, IndexEntry]) -> str:
    """Refuse unless the index holds exactly this model and blob as an unused, unpinned
    predictive download that no other indexed model shares."""
    if entry is None:
        return f"{MSG_EVICT_UNKNOWN_PROVENANCE}: {_short(sha256)} is cached but the index does not list {model_id}"
    if entry.sha256 != sha256:
        return f"{MSG_EVICT_SHA256_DIFFERS}: {model_id} is cached as {_short(entry.sha256)}, not {_short(sha256)}"
    if entry.pinned:
        return f"{MSG_EVICT_PINNED}: {model_id}"
    if not entry.predictive:
        return f"{MSG_EVICT_NOT_PREDICTIVE}: {model_id} was not downloaded by a predictive prefetch, or was used since"
    sharing = sorted(m for m, e in index.items() if m != model_id and e.sha256 == sha256)
    if sharing:
        return f"{MSG_EVICT_ARTIFACT_IN_USE}: also indexed as {sharing[0]}"
    return ""
