"""The store as status shows it without a local disk to measure (grid.controller.store_view)."""

from __future__ import annotations

from grid.controller import store_view as sv

MIB = 1 << 20
INFO = {"type": "io.nats.jetstream.api.v1.account_info_response", "memory": 0, "storage": 300 * MIB,
        "reserved_memory": 0, "reserved_storage": 900 * MIB, "streams": 9, "consumers": 4,
        "limits": {"max_memory": -1, "max_storage": -1}}


def test_an_account_without_a_limit_reports_usage_and_why_the_rest_is_empty():
    row = sv.account_store(INFO)
    assert (row["state"], row["source"], row["detail"]) == ("ok", sv.SOURCE_ACCOUNT, "")
    assert (row["jetstream_storage_bytes"], row["jetstream_reserved_bytes"]) == (300 * MIB, 900 * MIB)
    assert row["free_bytes"] is None and row["total_bytes"] is None
    assert sv.REASON_REMOTE_DISKS in row["reason"] and sv.REASON_NO_LIMIT in row["reason"]


def test_an_account_limit_gives_headroom_and_warns_when_it_runs_low():
    roomy = sv.account_store({**INFO, "limits": {"max_storage": 10_000 * MIB}})
    assert (roomy["state"], roomy["free_bytes"], roomy["total_bytes"]) == ("ok", 9_700 * MIB, 10_000 * MIB)
    tight = sv.account_store({**INFO, "storage": 9_990 * MIB, "limits": {"max_storage": 10_000 * MIB}})
    assert tight["state"] == "low_free_space" and "10 MiB left of the account's 10000 MiB" in tight["detail"]


def test_an_unreadable_account_is_unknown_with_its_reason():
    failed = sv.account_store(None, error="TimeoutError: nats: timeout")
    assert (failed["state"], failed["source"]) == ("unknown", sv.SOURCE_ACCOUNT)
    assert "TimeoutError" in failed["detail"] and failed["reason"]
    refused = sv.account_store({"error": {"code": 503, "description": "jetstream not enabled for account"}})
    assert "jetstream not enabled" in refused["detail"]
    assert sv.unmeasured("not read yet")["reason"] == "not read yet"
