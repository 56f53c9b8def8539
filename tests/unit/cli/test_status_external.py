"""`gridctl status` says why an external engine failed, not only `failed(ext)`."""

from __future__ import annotations

from grid.cli.admin import external_failure
from tests.unit.cli.statusdoc import host_row, rendered, status_doc

WARNING = "external_engine_unreachable: ext-model at http://127.0.0.1:9/v1: connection refused"


def _ext(state: str) -> dict:
    return {"model_id": "ext-model", "state": state, "managed": False, "pinned": False, "memory_mb": 100,
            "active_requests": 0, "artifact_sha256": None}


def test_failed_external_engine_shows_its_reason_in_the_human_view(monkeypatch):
    doc = status_doc([host_row(residencies=[_ext("failed")], warnings=[WARNING])])
    out, _ = rendered(doc, monkeypatch)
    line = next(ln for ln in out.splitlines() if "ext-model" in ln)
    assert "ext-model:failed(ext: unreachable: connection refused)" in line


def test_ready_external_engine_stays_plain(monkeypatch):
    out, _ = rendered(status_doc([host_row(residencies=[_ext("ready")])]), monkeypatch)
    assert "ext-model:ready(ext)" in out


def test_external_failure_reads_only_the_named_models_warning():
    warnings = ["external_engine_timeout: other at http://x: slow", WARNING, "state file quarantined"]
    assert external_failure(warnings, "ext-model") == "unreachable: connection refused"
    assert external_failure(warnings, "other") == "timeout: slow"
    assert external_failure(warnings, "ext") is None  # a prefix of another model's id is not it
    assert external_failure(["external_engine_api_key_refused: ext-model at http://x"], "ext-model") == "api_key_refused"
