"""Demand fold and forecast throughput, each against a baseline measured in the same run.

1. Request features folded per second: ``demand.apply`` over ``RequestBatch`` events of 512
   records (512 configured models, automatic traffic, affinity keys, a share of unknown names),
   compared with the raw msgspec decode of the same batch bytes (``codec.decode``): the fold
   has to keep up with reading the log.
2. Forecast time for 512 configured models with a full 60-bucket history, compared with a
   msgspec encode of the same demand state (one pass over the same data, the snapshot cost).

Usage: python -m bench.forecast [--batches N] [--models M]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from grid.events import codec
from grid.events.control import ModelProfile
from grid.events.requests import WORKLOADS, RequestBatch, RequestFeatures
from grid.demand.forecast import forecast
from grid.demand import fold as dm

BS = 60.0
T0 = 1_800_000_000.0 - (1_800_000_000.0 % BS)


def build_batches(n_batches: int, models: list[str], seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for b in range(n_batches):
        records = []
        for i in range(512):
            roll = rng.random()
            wl = WORKLOADS[rng.randrange(len(WORKLOADS))]
            served = models[rng.randrange(len(models))]
            if roll < 0.80:
                records.append(RequestFeatures(
                    endpoint="chat", requested_model=served, served_model=served, workload=wl,
                    input_units=rng.randrange(1, 4000), output_units=rng.randrange(1, 800),
                    service_seconds=rng.uniform(0.05, 8.0), queue_seconds=rng.uniform(0.0, 0.5),
                    queue_depth=rng.randrange(0, 4), finished_at=T0 + b, artifact_sha256="a" * 64,
                    affinity=(f"{rng.randrange(2000):064x}" if rng.random() < 0.2 else None),
                ))
            elif roll < 0.95:
                records.append(RequestFeatures(
                    endpoint="chat", requested_model="auto", served_model=served, workload=wl, auto=True,
                    service_seconds=rng.uniform(0.05, 8.0), finished_at=T0 + b,
                    affinity=(f"{rng.randrange(2000):064x}" if rng.random() < 0.5 else None),
                ))
            else:
                records.append(RequestFeatures(
                    endpoint="chat", requested_model=f"unknown-{b}-{i}", outcome="error", status_code=404,
                ))
        out.append(codec.encode(RequestBatch(event_id=f"b{b}", at=T0 + b, source="gw", records=tuple(records))))
    return out


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--models", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    models = [f"model-{i:04d}.gguf" for i in range(args.models)]
    configured = frozenset(models)
    blobs = build_batches(args.batches, models)
    n_records = args.batches * 512
    # Spread the batches over the 60-bucket window: 400 batches -> one every ~9 s.
    step = (BS * 60) / args.batches
    times = [T0 + i * step for i in range(args.batches)]

    def decode_only() -> None:
        for blob in blobs:
            codec.decode(blob)

    decoded = [codec.decode(blob) for blob in blobs]

    def fold_only() -> dm.DemandState:
        s = dm.initial()
        for ev, t in zip(decoded, times):
            s = dm.apply(s, ev, t, configured)
        return s

    def decode_and_fold() -> None:
        s = dm.initial()
        for blob, t in zip(blobs, times):
            s = dm.apply(s, codec.decode(blob), t, configured)

    t_decode = best_of(decode_only, args.repeat)
    t_fold = best_of(fold_only, args.repeat)
    t_both = best_of(decode_and_fold, args.repeat)
    state = fold_only()

    profiles = [
        ModelProfile(
            model_id=m, memory_mb=8000, max_replicas=8, min_replicas=(1 if i % 16 == 0 else 0),
            workload_scores={WORKLOADS[i % len(WORKLOADS)]: 0.9, "general": 0.5},
            latency_slo_ms=4000.0, artifact_sha256="a" * 64,
        )
        for i, m in enumerate(models)
    ]
    now = times[-1] + 30.0
    ready = {m: 1 for m in models[::3]}
    fc_times = []
    for _ in range(max(3, args.repeat)):
        start = time.perf_counter()
        fc = forecast(state, profiles, now, ready_replicas=ready)
        fc_times.append(time.perf_counter() - start)
    t_fc = min(fc_times)
    t_enc = best_of(lambda: dm.encode_state(state), max(3, args.repeat))
    snapshot = len(dm.encode_state(state))

    print(f"records: {n_records} in {args.batches} batches of 512; {args.models} configured models")
    print(f"baseline raw msgspec decode : {n_records / t_decode:12,.0f} records/s ({t_decode * 1e3:8.1f} ms)")
    print(f"demand.apply (pre-decoded)  : {n_records / t_fold:12,.0f} records/s ({t_fold * 1e3:8.1f} ms)")
    print(f"decode + demand.apply       : {n_records / t_both:12,.0f} records/s ({t_both * 1e3:8.1f} ms)")
    print(f"ratio fold / decode time    : {t_fold / t_decode:6.2f}x   (decode+fold / decode: {t_both / t_decode:.2f}x)")
    print(f"demand state snapshot       : {snapshot / 1024:8.1f} KiB, {len(state.models)} model series, "
          f"{sum(len(s.buckets) for s in state.models.values())} buckets, ignored={state.ignored}")
    print(f"forecast for {len(profiles)} models     : {t_fc * 1e3:8.1f} ms (median {statistics.median(fc_times) * 1e3:.1f} ms), "
          f"{len(fc.targets)} targets, {len(fc.correlations)} correlation edges")
    print(f"baseline state encode       : {t_enc * 1e3:8.1f} ms")
    print(f"ratio forecast / encode     : {t_fc / t_enc:6.2f}x")


if __name__ == "__main__":
    main()
