"""On a cluster the controller cannot see the servers' disks, and status used to say `store: null`.
It now reports what JetStream tells the account: storage used, what the streams reserve, and the
limit when there is one, with the source named and a reason for every field it cannot know.

Real parts: a 3-node nats-server cluster, the controller with its admin API connected to it (no
local store supervisor, as `gridctl serve controller --nats <cluster>` runs it), `gridctl status`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from grid.transport.cluster import NatsCluster
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.statuskit import serving_controller, status_until
from tests.integration.controller.test_cli_admin import gridctl


async def test_status_reports_the_store_from_the_jetstream_account_on_a_cluster(nats_cluster: NatsCluster,
                                                                               tmp_path: Path) -> None:
    log = await JetStreamLog.connect(nats_cluster.url)
    home = tmp_path / "home"

    async def nothing() -> None:
        return None

    try:
        async with serving_controller(log, home, "ctl-cluster-store"):
            doc = await status_until(home, nothing, lambda d: (d["store"] or {}).get("source") == "jetstream_account_info",
                                     "the store read from the JetStream account", timeout=30.0)
            store = doc["store"]
            assert store["state"] == "ok", store
            # The R3 streams reserve their byte limits on every replica: the account says how much.
            assert store["jetstream_reserved_bytes"] > 0 and store["jetstream_storage_bytes"] >= 0, store
            # No account limit and no visible disk: those fields are empty, and the reason says why.
            assert store["free_bytes"] is None and store["jetstream_max_bytes"] is None, store
            assert "disks are not visible" in store["reason"] and "no JetStream storage limit" in store["reason"]
            assert not [w for w in doc["warnings"] if w.startswith("event log store")], doc["warnings"]
            rc, out, err = await gridctl(home, "status")
            assert rc == 0, err
            assert "event log store (JetStream account): ok" in " ".join(out.split()), out
            # Never null, in --json either.
            rc, out, err = await gridctl(home, "status", "--json")
            assert rc == 0 and json.loads(out)["store"] is not None, err
            # /metrics exports the same reading: what the account knows, nothing for what it cannot.
            admin = (home / "admin.url").read_text().strip()
            async with httpx.AsyncClient(timeout=10) as client:
                text = (await client.get(f"{admin}/metrics")).text
            assert _metric(text, 'grid_store_source{source="jetstream_account_info"}') == 1.0, text
            assert _metric(text, 'grid_store_state{state="ok"}') == 1.0
            assert (_metric(text, "grid_store_jetstream_reserved_bytes") or 0) > 0
            assert _metric(text, "grid_store_free_bytes") is None
    finally:
        await log.close()


def _metric(text: str, sample: str) -> float | None:
    match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
    return None if match is None else float(match.group(1))
