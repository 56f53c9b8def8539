"""`gridctl status` and the controller's /metrics show the events its folds rejected.

A host writes, on its own subject, a heartbeat naming another host: the server stores it (it
never reads payloads), the controller's folds skip it (its subject does not vouch for it), and
status says so: a warning "1 event rejected: subject_mismatch=1", the counts and the latest
rejections (stream, seq, subject, reason, role) in `--json`, and
`grid_events_rejected_total{reason="subject_mismatch"}` on /metrics.
"""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from grid.events import codec
from grid.events.subjects import HOSTS_STREAM, host_subject
from grid.identity.provenance import SUBJECT_MISMATCH
from grid.metrics import exposition
from grid.transport.jetstream import JetStreamLog

from tests.heartbeats import heartbeat
from tests.integration.controller.statuskit import serving_controller, status_until
from tests.integration.controller.test_cli_admin import gridctl


async def test_status_and_metrics_show_rejected_events(js_log: JetStreamLog, tmp_path: Path) -> None:
    async def honest() -> None:
        await js_log.append(heartbeat("host-a"))

    await honest()
    forged = await js_log.append_raw(host_subject("host-a", "heartbeat"), codec.encode(heartbeat("host-b")))
    home = tmp_path / "home"
    async with serving_controller(js_log, home, "ctl-rejected") as ctl:
        doc = await status_until(home, honest, lambda d: d["rejected_events"]["total"] >= 1, "the rejection")
        assert doc["rejected_events"] == {
            "total": 1, "by_reason": {SUBJECT_MISMATCH: 1},
            "latest": [{"stream": HOSTS_STREAM, "seq": forged.seq, "subject": host_subject("host-a", "heartbeat"),
                        "reason": SUBJECT_MISMATCH, "role": None}],
        }
        assert [h["host_id"] for h in doc["hosts"]] == ["host-a"]  # never folded as host-b's
        assert any(w.startswith("1 event rejected: subject_mismatch=1") for w in doc["warnings"]), doc["warnings"]
        assert doc["revisions"]["malformed_events"] == 0

        rc, out, err = await gridctl(home, "status")
        assert rc == 0, err
        assert "1 event rejected: subject_mismatch=1" in " ".join(err.split())

        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(exposition(ctl.metrics.registry).decode())
                   for s in f.samples}
        assert samples[("grid_events_rejected_total", (("reason", SUBJECT_MISMATCH),))] == 1
        assert samples[("grid_events_rejected_total", (("reason", "unsigned"),))] == 0

        rc, out, err = await gridctl(home, "status", "--json")
        assert rc == 0, err
        assert json.loads(out)["rejected_events"]["total"] == 1
