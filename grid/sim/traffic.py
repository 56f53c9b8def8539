"""The request trace: every persona's requests, minute by minute, from the seed alone.

Generated once per scenario, before any strategy runs, so every strategy routes the identical
trace (the graduate gate checks the digest). A request carries only bounded features: the
classified workload, the endpoint, approximate size, the named model or `auto`, and the device
seconds it costs on a speed-1.0 machine.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

from grid.sim.personas import SERVICE_SECONDS, TEMPLATES, Persona, classified
from grid.sim.workday import Workday

AUTO = "auto"
# Users per synthetic project (an affinity key is the project's, double hashed).
PROJECT_SIZE = 5


@dataclass(frozen=True, slots=True)
class Request:
    minute: int
    offset: float  # seconds into the minute
    user: int
    endpoint: str
    modality: str
    workload: str  # what the production classifier made of it
    input_units: int
    model: str  # a model id, or AUTO
    service_seconds: float
    affinity: str


def _poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, int(round(rng.gauss(lam, math.sqrt(lam)))))
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def _affinity(user: int, seed: int) -> str:
    raw = hashlib.sha256(f"sim-project:{seed}:{user // PROJECT_SIZE}".encode()).digest()
    return hashlib.sha256(raw).hexdigest()


def _workflow_affinity(user: int, seed: int, project: int) -> str:
    raw = hashlib.sha256(f"sim-workflow:{seed}:{user}:{project}".encode()).digest()
    return hashlib.sha256(raw).hexdigest()


def _workflow_requests(persona: Persona, u: int, day: Workday, seed: int) -> list[Request]:
    """One workflow user's projects over the day: each stage one request, in order, under the
    project's own key. Its own random stream, so the other users' traffic is unchanged."""
    rng = random.Random(f"workflow:{seed}:{u}")
    period = max(1, int(round(60.0 / persona.rate)))
    out: list[Request] = []
    start = rng.randrange(period)
    project = 0
    while start < day.minutes:
        if persona.active(start, day.minutes):
            key = _workflow_affinity(u, seed, project)
            for w, after in persona.workflow:
                m = start + after
                if m >= day.minutes:
                    break
                template = rng.randrange(len(TEMPLATES[w][2]))
                endpoint, modality, cls, units = classified(w, template)
                out.append(Request(
                    minute=m, offset=round(rng.uniform(0.0, 20.0), 3), user=u, endpoint=endpoint, modality=modality,
                    workload=cls, input_units=units, model=AUTO,
                    service_seconds=round(SERVICE_SECONDS[w] * rng.uniform(0.5, 1.5), 3), affinity=key,
                ))
            project += 1
        start += period + rng.randrange(-2, 3)
    return out


def generate(users: tuple[Persona, ...], day: Workday, seed: int, models: frozenset[str]) -> tuple[tuple[Request, ...], ...]:
    """Requests per minute (each minute's tuple sorted by offset, then user)."""
    rng = random.Random(f"traffic:{seed}")
    keys = [_affinity(u, seed) for u in range(len(users))]
    minutes: list[list[Request]] = [[] for _ in range(day.minutes)]
    for m in range(day.minutes):
        bucket = minutes[m]
        for u, persona in enumerate(users):
            if persona.workflow or not persona.active(m, day.minutes):
                continue
            for w, weight in persona.mix:
                n = _poisson(rng, persona.rate * weight * day.curves[w][m])
                for _ in range(n):
                    template = rng.randrange(len(TEMPLATES[w][2]))
                    endpoint, modality, cls, units = classified(w, template)
                    named = (persona.named_model is not None and persona.named_model in models
                             and rng.random() < persona.named_share)
                    service = SERVICE_SECONDS[w] * rng.uniform(0.5, 1.5)
                    bucket.append(Request(
                        minute=m, offset=round(rng.uniform(0.0, 59.0), 3), user=u, endpoint=endpoint,
                        modality=modality, workload=cls, input_units=units,
                        model=persona.named_model if named else AUTO,  # type: ignore[arg-type]
                        service_seconds=round(service, 3), affinity=keys[u],
                    ))
    for u, persona in enumerate(users):
        if persona.workflow:
            for r in _workflow_requests(persona, u, day, seed):
                minutes[r.minute].append(r)
    for bucket in minutes:
        bucket.sort(key=lambda r: (r.offset, r.user))
    return tuple(tuple(b) for b in minutes)


def digest(trace: tuple[tuple[Request, ...], ...]) -> str:
    """A stable digest of the trace (strategies must route the same one)."""
    h = hashlib.sha256()
    for bucket in trace:
        for r in bucket:
            h.update(f"{r.minute}|{r.offset}|{r.user}|{r.workload}|{r.model}|{r.service_seconds}\n".encode())
    return h.hexdigest()
