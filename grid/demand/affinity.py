"""Affinity-bound workload sequences: which workload a workflow asks for next.

The gateway sends ``RequestFeatures.affinity``, the client's X-Grid-Affinity-Key already hashed
once. It is hashed again here before anything is stored, so workflow cursors and transitions
hold only a double-hashed key. Adjacent traffic from unrelated users is never sequence
evidence: a transition is only counted between two requests of the same workflow.

* :data:`MIN_TRANSITIONS` (5) repeated transitions from one workload to the same next one are
  required; confidence = count(src->dst) / every observed departure from src (self included).
* Caps: :data:`MAX_WORKFLOWS` (512) active cursors, :data:`MAX_TRANSITIONS` (4,096)
  transition counters; both expire after :data:`EXPIRY_SECONDS` (one hour) of receipt time.
* A completion whose ``finished_at`` is not strictly later than the cursor's (out of order or
  simultaneous) updates aggregate demand elsewhere but establishes no ordering here.
"""

from __future__ import annotations

import hashlib

import msgspec

MIN_TRANSITIONS = 5
MIN_CONFIDENCE = 0.5
MAX_WORKFLOWS = 512
MAX_TRANSITIONS = 4096
EXPIRY_SECONDS = 3600.0
# A cursor seen this recently is an active workflow whose next step may be predicted.
ACTIVE_SECONDS = 300.0
_SALT = b"grid.affinity.v1\x00"
_SEP = "\x1f"


class Cursor(msgspec.Struct, kw_only=True, array_like=True):
    workload: str
    finished_at: float
    seen_at: float


class TransitionCount(msgspec.Struct, kw_only=True, array_like=True):
    """How often one workload followed another in the same workflow, and when last (receipt time)."""

    count: int
    last_at: float


class AffinityState(msgspec.Struct, kw_only=True):
    # double-hashed key -> where that workflow last was
    cursors: dict[str, Cursor] = {}
    # "src\x1fdst" -> count
    transitions: dict[str, TransitionCount] = {}
    # receipt time of the last expiry sweep (sweeps run at most once a minute)
    swept_at: float = 0.0


class SequenceEdge(msgspec.Struct, frozen=True, kw_only=True):
    source: str
    target: str
    count: int
    departures: int
    confidence: float


class SequencePrediction(msgspec.Struct, frozen=True, kw_only=True):
    """Expected next-step arrivals for ``target`` from active workflows now at ``source``."""

    source: str
    target: str
    active_workflows: int
    confidence: float
    expected: float


def rehash(affinity: str) -> str:
    """Hash the once-hashed key again (the stored form). Never store the argument itself."""
    return hashlib.sha256(_SALT + affinity.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _expire(state: AffinityState, now: float) -> None:
    cutoff = now - EXPIRY_SECONDS
    for key in [k for k, c in state.cursors.items() if c.seen_at < cutoff]:
        del state.cursors[key]
    for key in [k for k, t in state.transitions.items() if t.last_at < cutoff]:
        del state.transitions[key]
    state.swept_at = now


def _evict(table: dict, order) -> None:
    """Drop the oldest eighth of a full table (amortised, deterministic: sorted by value, key)."""
    ranked = sorted(table.items(), key=lambda kv: order(kv[0], kv[1]))
    for key, _ in ranked[: max(1, len(ranked) // 8)]:
        del table[key]


def record_completion(state: AffinityState, affinity: str, workload: str, finished_at: float, at: float) -> None:
    """Fold one completion of a workflow (mutates ``state``). ``at`` is the receipt time."""
    if at - state.swept_at >= 60.0:
        _expire(state, at)
    key = rehash(affinity)
    cursor = state.cursors.get(key)
    if cursor is not None and at - cursor.seen_at > EXPIRY_SECONDS:
        del state.cursors[key]
        cursor = None
    if cursor is None:
        if len(state.cursors) >= MAX_WORKFLOWS:
            _evict(state.cursors, lambda k, c: (c.seen_at, k))
        state.cursors[key] = Cursor(workload=workload, finished_at=finished_at, seen_at=at)
        return
    cursor.seen_at = max(cursor.seen_at, at)
    if not finished_at > cursor.finished_at:
        return  # out of order or simultaneous: no ordering evidence
    tkey = cursor.workload + _SEP + workload
    t = state.transitions.get(tkey)
    if t is None:
        if len(state.transitions) >= MAX_TRANSITIONS:
            _evict(state.transitions, lambda k, t: (t.last_at, t.count, k))
        state.transitions[tkey] = TransitionCount(count=1, last_at=at)
    else:
        t.count += 1
        t.last_at = max(t.last_at, at)
    cursor.workload = workload
    cursor.finished_at = finished_at


def edges(state: AffinityState, now: float) -> tuple[SequenceEdge, ...]:
    """Learned edges (>= 5 transitions) with confidence over every departure from the source."""
    cutoff = now - EXPIRY_SECONDS
    departures: dict[str, int] = {}
    live: list[tuple[str, str, int]] = []
    for key in sorted(state.transitions):
        t = state.transitions[key]
        if t.last_at < cutoff:
            continue
        src, _, dst = key.partition(_SEP)
        departures[src] = departures.get(src, 0) + t.count
        live.append((src, dst, t.count))
    out = []
    for src, dst, count in live:
        if count >= MIN_TRANSITIONS:
            dep = departures[src]
            out.append(SequenceEdge(source=src, target=dst, count=count, departures=dep, confidence=count / dep))
    return tuple(out)


def predictions(state: AffinityState, now: float, *, min_confidence: float = MIN_CONFIDENCE) -> tuple[SequencePrediction, ...]:
    """Next-step predictions from workflows active within :data:`ACTIVE_SECONDS` of ``now``."""
    learned = [e for e in edges(state, now) if e.confidence >= min_confidence and e.source != e.target]
    if not learned:
        return ()
    active: dict[str, int] = {}
    for cursor in state.cursors.values():
        if 0.0 <= now - cursor.seen_at <= ACTIVE_SECONDS:
            active[cursor.workload] = active.get(cursor.workload, 0) + 1
    out = []
    for e in learned:
        n = active.get(e.source, 0)
        if n:
            out.append(SequencePrediction(
                source=e.source, target=e.target, active_workflows=n,
                confidence=e.confidence, expected=n * e.confidence,
            ))
    return tuple(out)
