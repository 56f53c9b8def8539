"""Builders shared by the forecast tests (real events, real projection, no mocks)."""

from __future__ import annotations

from collections.abc import Iterable

from grid.events.control import ModelProfile
from grid.events.requests import RequestBatch, RequestCompleted, RequestFailed, RequestFeatures
from grid.demand import fold as demand_mod
from grid.demand.fold import DemandState

BS = 60.0
# A bucket-aligned origin far from zero so negative offsets stay valid.
T0 = 1_000_000 * BS


def at(bucket: int, second: float = 1.0) -> float:
    """Receipt time `second` seconds into bucket number `bucket` after T0."""
    return T0 + bucket * BS + second


def rec(model: str = "a", **kw) -> RequestFeatures:
    kw.setdefault("endpoint", "chat")
    kw.setdefault("service_seconds", 2.0)
    return RequestFeatures(requested_model=model, **kw)


def auto(workload: str, served: str | None = None, **kw) -> RequestFeatures:
    kw.setdefault("endpoint", "chat")
    kw.setdefault("service_seconds", 2.0)
    return RequestFeatures(requested_model="auto", served_model=served, workload=workload, auto=True, **kw)


_n = 0


def _eid() -> str:
    global _n
    _n += 1
    return f"e{_n}"


def batch(records: Iterable[RequestFeatures]) -> RequestBatch:
    return RequestBatch(event_id=_eid(), at=0.0, source="gw", records=tuple(records))


def completed(r: RequestFeatures) -> RequestCompleted:
    return RequestCompleted(event_id=_eid(), at=0.0, features=r)


def failed(r: RequestFeatures) -> RequestFailed:
    return RequestFailed(event_id=_eid(), at=0.0, features=r)


def fold(state: DemandState, t: float, records: Iterable[RequestFeatures], configured) -> DemandState:
    return demand_mod.apply(state, batch(records), t, frozenset(configured))


def feed(state: DemandState, model: str, counts: Iterable[int], configured, *, start: int = 0, **kw) -> DemandState:
    """`counts[i]` direct requests for `model` in bucket `start + i`."""
    for i, n in enumerate(counts):
        if n:
            state = fold(state, at(start + i), [rec(model, **kw) for _ in range(n)], configured)
    return state


def profile(model_id: str, **kw) -> ModelProfile:
    kw.setdefault("memory_mb", 1000)
    kw.setdefault("max_replicas", 8)
    return ModelProfile(model_id=model_id, **kw)


def row(fc, model_id: str):
    return next(m for m in fc.models if m.model_id == model_id)


def target(fc, model_id: str):
    return next((t for t in fc.targets if t.model_id == model_id), None)


def wrow(fc, workload: str):
    return next((w for w in fc.workloads if w.workload == workload), None)
