"""Admin API over httpx ASGITransport against a real JetStream log."""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from grid.controller.api import create_admin_app
from grid.controller.service import Controller, ControllerSettings
from grid.events import codec
from grid.events.control import ForecastWindowSet, ModeSet, ProfileRemoved, ProfileSet, TickRequested
from grid.events.log import InMemoryLog
from grid.events.subjects import CONTROL_STREAM
from grid.transport.jetstream import JetStreamLog

SETTINGS = ControllerSettings(tick_interval_seconds=0.5, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0)
SHA = "AB" * 32


@pytest.fixture
async def ctl(js_log: JetStreamLog, tmp_path: Path) -> AsyncIterator[Controller]:
    c = Controller(js_log, tmp_path / "home", settings=SETTINGS, controller_id="ctl-api")
    await c.start()
    try:
        yield c
    finally:
        await c.stop()


def client(c: Controller, *, token: str | None = None, peer: str = "127.0.0.1") -> httpx.AsyncClient:
    headers = {"X-Grid-Allocator-Token": token} if token is not None else {}
    transport = httpx.ASGITransport(app=create_admin_app(c), client=(peer, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://controller", headers=headers)


async def control_events(log: JetStreamLog) -> list:  # type: ignore[type-arg]
    return [codec.decode(m.data) async for m in log.replay(CONTROL_STREAM)]


async def test_operator_token_is_owner_only_and_required(ctl: Controller) -> None:
    path = ctl.config.operator_token_path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert ctl.token and path.read_text().strip() == ctl.token
    body = {"memory_mb": 1000}
    async with client(ctl) as c:
        r = await c.put("/allocator/models/m", json=body)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    async with client(ctl, token="wrong") as c:
        assert (await c.put("/allocator/models/m", json=body)).status_code == 401
        assert (await c.put("/allocator/mode", json={"mode": "observe"})).status_code == 401
        assert (await c.post("/allocator/tick")).status_code == 401
        assert (await c.delete("/allocator/models/m")).status_code == 401
    async with client(ctl) as c:
        r = await c.put("/allocator/models/m", json=body, headers={"Authorization": f"Bearer {ctl.token}"})
        assert r.status_code == 200
    assert [type(e) for e in await control_events(ctl.log)] == [ProfileSet]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"memory_mb": "lots"}, "memory_mb"),
        ({}, "memory_mb"),
        ({"memory_mb": 0}, "memory_mb"),
        ({"memory_mb": 10, "bogus": 1}, "bogus"),
        ({"memory_mb": 10, "model_id": "other"}, "model_id"),
        ({"memory_mb": 10, "artifact_sha256": "xyz"}, "artifact_sha256"),
        ({"memory_mb": 10, "artifact_source": "hf://o/r/m.gguf", "artifact_size_mb": 5}, "artifact_sha256"),
        ({"memory_mb": 10, "artifact_source": "hf://o/r/m.gguf", "artifact_sha256": SHA}, "artifact_size_mb"),
        ({"memory_mb": 10, "artifact_source": "https://u:p@h/m.gguf", "artifact_sha256": SHA,
          "artifact_size_mb": 5}, "artifact_source"),
        ({"memory_mb": 10, "min_replicas": 3, "max_replicas": 1}, "max_replicas"),
        ({"memory_mb": 10, "workload_scores": {"coding": 1.5}}, "workload_scores"),
        ({"memory_mb": 10, "target_utilization": 0}, "target_utilization"),
        ({"memory_mb": 10, "data_tier": "secret"}, "data_tier"),
        ({"memory_mb": 10, "runtime_memory_mb": {"vllm": "x"}}, "runtime_memory_mb"),
        ({"memory_mb": 10, "runtimes": []}, "runtimes"),
    ],
)
async def test_malformed_profile_is_422_with_field_and_appends_nothing(ctl: Controller, body: dict, field: str) -> None:  # type: ignore[type-arg]
    async with client(ctl, token=ctl.token) as c:
        r = await c.put("/allocator/models/m", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field, r.json()
    assert await control_events(ctl.log) == []


async def test_malformed_json_and_oversized_bodies(ctl: Controller) -> None:
    async with client(ctl, token=ctl.token) as c:
        r = await c.put("/allocator/models/m", content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and r.json()["error"] == "malformed_json"
        r = await c.put("/allocator/models/m", content=b"x" * (64 * 1024 + 1))
        assert r.status_code == 413
        r = await c.put("/allocator/mode", json={"mode": "turbo"})
        assert r.status_code == 422 and r.json()["field"] == "mode"
        r = await c.put("/allocator/mode", json={"mode": "observe", "extra": True})
        assert r.status_code == 422 and r.json()["field"] == "extra"
        r = await c.delete("/allocator/models/nope")
        assert r.status_code == 404
    assert await control_events(ctl.log) == []


async def test_mutations_append_control_events_and_show_in_status(ctl: Controller) -> None:
    profile = {"memory_mb": 1200, "artifact_sha256": SHA, "artifact_source": "hf://o/r/m.gguf",
               "artifact_size_mb": 900, "min_replicas": 1, "max_replicas": 3, "workload_scores": {"coding": 1.0},
               "runtime_memory_mb": {"vllm": 2000}, "runtimes": ["llama.cpp", "vllm"]}
    async with client(ctl, token=ctl.token) as c:
        r = await c.put("/allocator/models/org.Model.Q4.gguf", json=profile)
        assert r.status_code == 200, r.text
        assert r.json()["profile"]["artifact_sha256"] == SHA.lower()
        r = await c.put("/allocator/mode", json={"mode": "observe"})
        assert r.status_code == 200
        r = await c.post("/allocator/tick", json={"reason": "operator"})
        assert r.status_code == 200 and r.json()["tick"]["mode"] == "observe"
        status = (await c.get("/allocator/status")).json()
        assert status["mode"]["requested"] == "observe"
        assert [p["model_id"] for p in status["profiles"]] == ["org.Model.Q4.gguf"]
        assert status["profiles"][0]["artifact_sha256"] == SHA.lower()
        assert status["revisions"]["profiles"]["org.Model.Q4.gguf"] >= 1
        assert status["controller"]["lease"]["state"] == "held"
        for key in ("hosts", "models", "forecasts", "plan", "reconciliation", "pending_commands",
                    "withdrawn_destructive", "history", "warnings", "last_tick"):
            assert key in status
        r = await c.delete("/allocator/models/org.Model.Q4.gguf")
        assert r.status_code == 200
        status = (await c.get("/allocator/status")).json()
        assert status["profiles"] == [] and status["retired"][0]["model_id"] == "org.Model.Q4.gguf"
    kinds = [type(e) for e in await control_events(ctl.log)]
    assert kinds == [ProfileSet, ModeSet, TickRequested, ProfileRemoved]


async def test_status_is_open_on_loopback_only(ctl: Controller) -> None:
    async with client(ctl, peer="127.0.0.1") as c:
        assert (await c.get("/allocator/status")).status_code == 200
    async with client(ctl, peer="10.1.2.3") as c:
        assert (await c.get("/allocator/status")).status_code == 401
    async with client(ctl, peer="10.1.2.3", token=ctl.token) as c:
        assert (await c.get("/allocator/status")).status_code == 200


async def test_automatic_mode_is_refused_on_a_non_durable_log(tmp_path: Path) -> None:
    log = InMemoryLog()
    c = Controller(log, tmp_path / "home", settings=SETTINGS, controller_id="mem")
    await c.start()
    try:
        async with client(c, token=c.token) as http:
            r = await http.put("/allocator/mode", json={"mode": "automatic"})
            assert r.status_code == 409 and r.json()["error"] == "log_not_durable"
            status = (await http.get("/allocator/status")).json()
        assert status["mode"]["requested"] == "recommend"
        assert any("not durable" in w for w in status["warnings"])
        # Even if the log says automatic (another writer), the service runs it as recommend.
        await c.append_control(ModeSet(event_id="m1", at=0, mode="automatic"))
        report = await c.tick("test")
        assert report.mode == "automatic" and report.effective_mode == "recommend"
    finally:
        await c.stop()


async def test_the_forecast_window_is_set_on_the_log_and_shown_by_status(ctl: Controller) -> None:
    async with client(ctl, token=ctl.token) as c:
        for body, field in (({"bucket_seconds": 0.5}, "bucket_seconds"), ({"bucket_seconds": 7200}, "bucket_seconds"),
                            ({"bucket_seconds": "4"}, "bucket_seconds"), ({"seconds": 4}, "seconds")):
            r = await c.put("/allocator/forecast-window", json=body)
            assert r.status_code == 422 and r.json()["field"] == field, r.text
        r = await c.put("/allocator/forecast-window", json={"bucket_seconds": 4})
        assert r.status_code == 200 and r.json()["bucket_seconds"] == 4.0, r.text
        await c.post("/allocator/tick", json={"reason": "operator"})
        status = (await c.get("/allocator/status")).json()
        assert status["forecasts"]["bucket_seconds"] == 4.0
        assert "/allocator/forecast-window" in (await c.get("/openapi.json")).json()["paths"]
    async with client(ctl, token=None) as c:
        assert (await c.put("/allocator/forecast-window", json={"bucket_seconds": 4})).status_code == 401
    events = [e for e in await control_events(ctl.log) if isinstance(e, ForecastWindowSet)]
    assert [e.bucket_seconds for e in events] == [4.0]
