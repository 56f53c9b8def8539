"""plan_key: which plan changes the controller records. A predictive cache decision becomes a
command (a prefetch load, an exact-SHA evict), so adding or dropping one is a change; its drifting
figures (value per MB, free disk after, an entry's age) are not."""

from __future__ import annotations

import msgspec

from grid.controller.service import plan_key
from grid.fleet import reasons as R
from grid.fleet.planning import CacheEviction, Plan, PrefetchAdvisory

SHA = "ab" * 32
BASE = Plan(planner_version="v", inputs_digest="d1", now=100.0)
ADVISORY = PrefetchAdvisory(host_id="h1", model_id="m", artifact_sha256=SHA, size_bytes=1 << 20,
                            reason=R.PREDICTIVE_PREFETCH, value_per_mb=1.5, disk_free_after_bytes=5 << 30)
EXPIRY = CacheEviction(host_id="h1", model_id="m", artifact_sha256=SHA, size_bytes=1 << 20,
                       reason=R.PREDICTIVE_CACHE_EXPIRED, age_seconds=21.0)


def test_an_advisory_or_an_expiry_added_or_dropped_is_a_new_plan() -> None:
    keys = {
        plan_key(BASE),
        plan_key(msgspec.structs.replace(BASE, prefetch=(ADVISORY,))),
        plan_key(msgspec.structs.replace(BASE, evictions=(EXPIRY,))),
        plan_key(msgspec.structs.replace(BASE, prefetch=(msgspec.structs.replace(ADVISORY, host_id="h2"),))),
        plan_key(msgspec.structs.replace(BASE, evictions=(msgspec.structs.replace(EXPIRY, artifact_sha256="cd" * 32),))),
    }
    assert len(keys) == 5


def test_drifting_figures_and_inputs_are_not_a_new_plan() -> None:
    advised = msgspec.structs.replace(BASE, prefetch=(ADVISORY,), evictions=(EXPIRY,))
    drifted = msgspec.structs.replace(
        advised, inputs_digest="d2", now=101.0,
        prefetch=(msgspec.structs.replace(ADVISORY, value_per_mb=1.4, disk_free_after_bytes=4 << 30),),
        evictions=(msgspec.structs.replace(EXPIRY, age_seconds=22.5),),
    )
    assert plan_key(drifted) == plan_key(advised)
