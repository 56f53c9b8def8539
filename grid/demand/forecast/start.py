"""How soon a model could serve, the lookahead its trend is projected over: the caller's
fastest eligible load+warm path, else learned timings (once authoritative, for the profile's
artifact), else the profile's own load and warm seconds."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from grid.demand.forecast.series import finite
from grid.demand.forecast.types import ForecastConfig
from grid.events.control import ModelProfile
from grid.fleet.planning import TimingSample


def start_seconds(
    profiles: Sequence[ModelProfile],
    fastest_start_seconds: Mapping[str, float],
    timings: Sequence[TimingSample],
    cfg: ForecastConfig,
) -> dict[str, float]:
    by_id = {p.model_id: p for p in profiles}
    learned: dict[str, float] = {}
    for s in timings:
        p = by_id.get(s.model_id)
        if p is None or s.samples < cfg.authoritative_timing_samples or s.artifact_sha256 != p.artifact_sha256:
            continue
        load = s.load_seconds if s.load_seconds is not None else p.load_seconds
        warm = s.warm_seconds if s.warm_seconds is not None else p.warm_seconds
        total = finite(load, p.load_seconds) + finite(warm, p.warm_seconds)
        if total >= 0 and (s.model_id not in learned or total < learned[s.model_id]):
            learned[s.model_id] = total
    out: dict[str, float] = {}
    for m, p in by_id.items():
        given = fastest_start_seconds.get(m)
        if given is not None and math.isfinite(given) and given >= 0:
            out[m] = given
        elif m in learned:
            out[m] = learned[m]
        else:
            out[m] = max(0.0, finite(p.load_seconds) + finite(p.warm_seconds))
    return out
