"""Table tests: every hard check rejects with its named reason (and passes otherwise)."""

from __future__ import annotations

import pytest

from grid.events.host import CachedArtifact
from grid.fleet import reasons as R
from grid.fleet.planning import Policy
from grid.planner.feasibility import CHAIN, FeasibilityChain
from grid.planner.plan import plan

from .builders import (
    GB,
    NOW,
    count,
    explanation,
    host,
    mk,
    on,
    prof,
    res,
    shortfall_reasons,
)

SHA = "a" * 64

# (case id, host kwargs, profile kwargs, expected reason) -- single host, model wants 1 replica.
STATIC_CASES = [
    ("never-heard", {"hb": None}, {}, R.HEARTBEAT_MISSING),
    ("paused", {"state": "paused"}, {}, R.HOST_NOT_ELIGIBLE_STATE),
    ("draining", {"state": "draining"}, {}, R.HOST_NOT_ELIGIBLE_STATE),
    ("unhealthy", {"state": "unhealthy"}, {}, R.HOST_NOT_ELIGIBLE_STATE),
    ("quarantined", {"state": "quarantined"}, {}, R.HOST_NOT_ELIGIBLE_STATE),
    ("stale", {"hb": NOW - 31.0}, {}, R.HEARTBEAT_STALE),
    ("future", {"hb": NOW + 6.0}, {}, R.HEARTBEAT_FUTURE),
    ("runtime", {"runtimes": ("vllm",)}, {}, R.RUNTIME_MISMATCH),
    (
        "runtime-listed",
        {"runtimes": ("llama.cpp",)},
        {"runtimes": ("mlx",)},
        R.RUNTIME_MISMATCH,
    ),
    ("backend", {"backends": ("cpu",)}, {"backends": ("cuda",)}, R.BACKEND_MISMATCH),
    ("tier", {"tier": "internal"}, {"data_tier": "confidential"}, R.DATA_TIER),
    (
        "required-tag",
        {"tags": ("ssd",)},
        {"required_tags": ("gpu",)},
        R.MISSING_REQUIRED_TAG,
    ),
    (
        "forbidden-tag",
        {"tags": ("battery",)},
        {"forbidden_tags": ("battery",)},
        R.FORBIDDEN_TAG,
    ),
    ("allow", {}, {"allow_hosts": ("other",)}, R.NOT_ALLOWED),
    ("deny", {}, {"deny_hosts": ("h1",)}, R.DENIED),
    ("pin", {}, {"pins": ("other",)}, R.PIN_MISMATCH),
    ("gpu-count", {"gpus": 1}, {"min_gpu_count": 2}, R.GPU_COUNT),
    (
        "gpu-memory",
        {"gpus": 1, "gpu_mem": 8000},
        {"min_gpu_memory_mb": 24000},
        R.GPU_MEMORY,
    ),
    ("never-fits", {"cap": 3000}, {}, R.INSUFFICIENT_MEMORY),
    ("reserve", {"cap": 8000, "reserved": 5000}, {}, R.INSUFFICIENT_MEMORY),
    ("derating", {"cap": 8000, "derating": 0.4}, {}, R.INSUFFICIENT_MEMORY),
    (
        "no-disk-telemetry",
        {"disk_free": None},
        {"artifact_size_mb": 1000, "artifact_sha256": SHA},
        R.INSUFFICIENT_DISK,
    ),
]


@pytest.mark.parametrize(
    "case,hkw,pkw,reason", STATIC_CASES, ids=[c[0] for c in STATIC_CASES]
)
def test_static_check_rejects_with_reason(case, hkw, pkw, reason):
    p = plan(mk([prof("m", 4000, **pkw)], [host("h1", **hkw)]))
    assert count(p, "m") == 0
    ex = explanation(p, "m")
    assert ex.eligible_count == 0
    assert ex.rejected_counts == {reason: 1}
    assert [v.reason for v in ex.rejected] == [reason]
    assert ex.shortfall_reason == (
        R.PIN_UNSATISFIED if case == "pin" else R.NO_ELIGIBLE_HOST
    )


PASS_CASES = [
    ("throttled-eligible", {"state": "throttled"}, {}),
    ("heartbeat-at-timeout", {"hb": NOW - 30.0}, {}),
    ("heartbeat-within-skew", {"hb": NOW + 5.0}, {}),
    ("tier-higher", {"tier": "restricted"}, {"data_tier": "confidential"}),
    (
        "tags-ok",
        {"tags": ("gpu", "ssd")},
        {"required_tags": ("gpu",), "forbidden_tags": ("battery",)},
    ),
    ("allow-ok", {}, {"allow_hosts": ("h1",)}),
    ("pin-ok", {}, {"pins": ("h1",)}),
    (
        "gpu-ok",
        {"gpus": 2, "gpu_mem": 24000},
        {"min_gpu_count": 2, "min_gpu_memory_mb": 24000},
    ),
    ("backend-ok", {"backends": ("cuda", "cpu")}, {"backends": ("cuda",)}),
    ("default-runtime", {"runtimes": ("vllm", "llama.cpp")}, {}),
]


@pytest.mark.parametrize("case,hkw,pkw", PASS_CASES, ids=[c[0] for c in PASS_CASES])
def test_static_checks_pass(case, hkw, pkw):
    p = plan(mk([prof("m", 4000, **pkw)], [host("h1", **hkw)]))
    assert count(p, "m") == 1
    assert not p.shortfalls


# Dynamic checks: (case id, hosts, profiles, model under test, expected capacity reason)
def _dyn_cases():
    return [
        (
            "model-limit",
            [host("h1", limit=1, residencies=(res("x", 2000),))],
            [prof("x", 2000), prof("m", 2000)],
            R.MODEL_LIMIT,
        ),
        (
            "colocation-own-limit",
            [host("h1", residencies=(res("x", 2000),))],
            [prof("x", 2000), prof("m", 2000, max_colocated_models=1)],
            R.COLOCATION_LIMIT,
        ),
        (
            "colocation-reciprocal-limit",
            [host("h1", residencies=(res("x", 2000),))],
            [prof("x", 2000, max_colocated_models=1), prof("m", 2000)],
            R.COLOCATION_LIMIT,
        ),
        (
            "colocation-excluded-by-other",
            [host("h1", residencies=(res("x", 2000),))],
            [prof("x", 2000, colocation_excludes=("m",)), prof("m", 2000)],
            R.COLOCATION_EXCLUDED,
        ),
        (
            "colocation-excluded-by-self",
            [host("h1", residencies=(res("x", 2000),))],
            [prof("x", 2000), prof("m", 2000, colocation_excludes=("x",))],
            R.COLOCATION_EXCLUDED,
        ),
        (
            "colocation-excluded-unprofiled-resident",
            [host("h1", residencies=(res("ext", 2000, managed=False),))],
            [prof("m", 2000, colocation_excludes=("ext",))],
            R.COLOCATION_EXCLUDED,
        ),
        (
            "desired-ledger",
            [host("h1", 10_000, residencies=(res("x", 7000),))],
            [prof("x", 7000), prof("m", 4000)],
            R.INSUFFICIENT_MEMORY,
        ),
        (
            "live-ledger-headroom",
            # 4000 free, but a new 4000 MB allocation needs 4200 with 5% headroom.
            [host("h1", 10_000, unmanaged=6000)],
            [prof("m", 4000)],
            R.INSUFFICIENT_MEMORY,
        ),
        (
            "disk",
            [host("h1", disk_free=2 * GB)],
            [prof("m", 2000, artifact_size_mb=1500, artifact_sha256="b" * 64)],
            R.INSUFFICIENT_DISK,
        ),
    ]


@pytest.mark.parametrize(
    "case,hosts,profiles,reason", _dyn_cases(), ids=[c[0] for c in _dyn_cases()]
)
def test_dynamic_check_rejects_with_reason(case, hosts, profiles, reason):
    p = plan(mk(profiles, hosts))
    assert count(p, "m") == 0
    ex = explanation(p, "m")
    assert ex.eligible_count == 1
    assert ex.capacity_counts == {reason: 1}
    assert ex.rejected[0].eligible and ex.rejected[0].reason == reason
    assert ex.shortfall_reason == reason


def test_obsolete_process_holds_live_ledger_until_released():
    # The obsolete 'old' process still holds memory until the reconciler unloads it: make
    # before break. The model waits for it (no eviction is needed, nothing is overcommitted).
    p = plan(
        mk([prof("m", 4000)], [host("h1", 10_000, residencies=(res("old", 7000),))])
    )
    assert count(p, "m") == 0 and not p.preemptions
    assert shortfall_reasons(p, "m") == {R.AWAITING_RELEASE}
    p = plan(mk([prof("m", 4000)], [host("h1", 10_000)]))
    assert on(p, "m") == ["h1"]


def test_existing_process_readmitted_without_phantom_headroom():
    # The incumbent uses all new-work memory: no free headroom, yet it keeps its slot.
    p = plan(
        mk([prof("m", 10_000)], [host("h1", 10_000, residencies=(res("m", 10_000),))])
    )
    assert [(x.host_id, x.status) for x in p.placements] == [("h1", "existing")]
    assert not p.shortfalls


def test_unmanaged_consumes_capacity_first():
    h = host(
        "h1", 10_000, unmanaged=3000, residencies=(res("ext", 3000, managed=False),)
    )
    p = plan(mk([prof("m", 3800)], [h]))  # 3800 * 1.05 = 3990 <= 4000
    assert count(p, "m") == 1
    p = plan(mk([prof("m", 3900)], [h]))  # 4095 > 4000
    assert count(p, "m") == 0


def test_chain_order_is_declared_once():
    chain = FeasibilityChain()
    assert [c.__name__ for c in chain.lifecycle] == [
        "check_heartbeat_missing",
        "check_host_state",
        "check_heartbeat_stale",
        "check_heartbeat_future",
    ]
    assert [c.__name__ for c in chain.policy] == [
        "check_denied",
        "check_allowed",
        "check_pinned",
        "check_qualified",
    ]
    assert chain.compat[0].__name__ == "check_data_tier"
    assert chain.dynamic[0].__name__ == "check_present"
    assert CHAIN.dynamic[-1].__name__ == "check_disk"


def test_lifecycle_reason_wins_over_model_mismatch():
    p = plan(
        mk([prof("m", 4000, required_tags=("gpu",))], [host("h1", state="paused")])
    )
    assert explanation(p, "m").rejected_counts == {R.HOST_NOT_ELIGIBLE_STATE: 1}


def test_deny_wins_over_allow():
    p = plan(
        mk([prof("m", 4000, allow_hosts=("h1",), deny_hosts=("h1",))], [host("h1")])
    )
    assert explanation(p, "m").rejected_counts == {R.DENIED: 1}


def test_cached_artifact_skips_disk_telemetry_check():
    h = host(
        "h1",
        disk_free=None,
        cached=(CachedArtifact(model_id="m", sha256=SHA, size_bytes=GB),),
    )
    p = plan(mk([prof("m", 4000, artifact_size_mb=1000, artifact_sha256=SHA)], [h]))
    assert on(p, "m") == ["h1"]


def test_timeouts_follow_policy():
    pol = Policy(heartbeat_timeout_seconds=120.0, future_skew_seconds=0.0)
    p = plan(
        mk(
            [prof("m")],
            [host("h1", hb=NOW - 100.0), host("h2", hb=NOW + 1.0)],
            policy=pol,
        )
    )
    assert on(p, "m") == ["h1"]
    assert explanation(p, "m").rejected_counts == {R.HEARTBEAT_FUTURE: 1}
