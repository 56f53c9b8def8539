"""POST /allocator/evaluations and `gridctl model evaluate` against a real controller on JetStream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from grid.controller.api import create_admin_app, serve_admin
from grid.controller.service import Controller, ControllerSettings
from grid.demand import outcomes
from grid.events import codec
from grid.events.control import ModelProfile, ProfileSet
from grid.events.evaluations import EvaluationRecorded
from grid.events.subjects import CONTROL_STREAM
from grid.transport.jetstream import JetStreamLog
from tests.integration.controller.test_cli_admin import gridctl

SETTINGS = ControllerSettings(tick_interval_seconds=0.5, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0)
SHA = "ab" * 32
MODEL = "coder.Q4.gguf"


@pytest.fixture
async def ctl(js_log: JetStreamLog, tmp_path: Path) -> AsyncIterator[Controller]:
    c = Controller(js_log, tmp_path / "home", settings=SETTINGS, controller_id="ctl-eval")
    await c.start()
    try:
        for model, sha in ((MODEL, SHA), ("external.gguf", None)):
            await c.append_control(ProfileSet(event_id=f"p-{model}", at=c.clock.now(), profile=ModelProfile(
                model_id=model, memory_mb=1000, artifact_sha256=sha, workload_scores={"coding": 0.8})))
        yield c
    finally:
        await c.stop()


def client(c: Controller, token: str | None) -> httpx.AsyncClient:
    headers = {"X-Grid-Allocator-Token": token} if token is not None else {}
    transport = httpx.ASGITransport(app=create_admin_app(c), client=("127.0.0.1", 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://controller", headers=headers)


async def evaluations(log: JetStreamLog) -> list[EvaluationRecorded]:
    return [e for e in [codec.decode(m.data) async for m in log.replay(CONTROL_STREAM)]
            if isinstance(e, EvaluationRecorded)]


def quality(c: Controller, model: str = MODEL, sha: str | None = SHA) -> outcomes.OutcomeView:
    return outcomes.view(c.runner["demand"].outcomes, model, "coding", sha, c.clock.now())


async def test_only_the_operator_token_may_record_an_evaluation(ctl: Controller) -> None:
    body = {"model_id": MODEL, "workload": "coding", "passed": 8, "total": 8}
    for token in (None, "wrong", "", ctl.token + "x"):  # type: ignore[operator]
        async with client(ctl, token) as c:
            r = await c.post("/allocator/evaluations", json=body)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    # A bearer that is not the operator token (a gateway client key, say) is refused too.
    async with client(ctl, None) as c:
        r = await c.post("/allocator/evaluations", json=body, headers={"Authorization": "Bearer client-key"})
    assert r.status_code == 401
    assert await evaluations(ctl.log) == []
    assert quality(ctl).quality is None


async def test_an_evaluation_is_appended_and_moves_quality_confidence(ctl: Controller) -> None:
    async with client(ctl, ctl.token) as c:
        r = await c.post("/allocator/evaluations", json={
            "model_id": MODEL, "workload": "coding", "passed": 6, "total": 8, "latency_ms": 900.0,
            "artifact_sha256": SHA.upper()})
        assert r.status_code == 200, r.text
        assert r.json() | {"seq": 0} == {"model_id": MODEL, "workload": "coding", "score": 0.75, "samples": 8,
                                         "artifact_sha256": SHA, "seq": 0}
        # A bare score for a model without a configured revision counts as one evaluation.
        r = await c.post("/allocator/evaluations", json={"model_id": "external.gguf", "workload": "coding",
                                                         "score": 0.5})
        assert r.status_code == 200 and r.json()["artifact_sha256"] is None and r.json()["samples"] == 1
    [first, second] = await evaluations(ctl.log)
    assert (first.model_id, first.score, first.samples, first.passed, first.total, first.latency_ms,
            first.artifact_sha256) == (MODEL, 0.75, 8, 6, 8, 900.0, SHA)
    assert second.artifact_sha256 is None
    view = quality(ctl)
    assert view.quality == pytest.approx(0.75) and view.quality_confidence == pytest.approx(1.0)
    assert view.samples == 0.0  # no service evidence was manufactured
    assert quality(ctl, "external.gguf", None).quality_confidence == pytest.approx(1 / 8)
    # The portfolio score reads it: 0.75 quality at full confidence adds 5 points.
    assert outcomes.candidate_score(80.0, view) == pytest.approx(80.0 + 20.0 * 0.25 + view.bonus)


@pytest.mark.parametrize(
    ("body", "status", "error", "field"),
    [
        ({"model_id": MODEL, "workload": "coding", "passed": 1, "total": 1, "artifact_sha256": "cd" * 32},
         409, "artifact_mismatch", "artifact_sha256"),
        ({"model_id": "external.gguf", "workload": "coding", "score": 1.0, "artifact_sha256": SHA},
         409, "artifact_mismatch", "artifact_sha256"),
        ({"model_id": "nobody.gguf", "workload": "coding", "score": 1.0}, 404, "unknown_model", "model_id"),
        ({"model_id": MODEL, "workload": "poetry", "score": 1.0}, 422, "validation_error", "workload"),
        ({"model_id": MODEL, "workload": "coding"}, 422, "validation_error", "score"),
        ({"model_id": MODEL, "workload": "coding", "passed": 3}, 422, "validation_error", "total"),
        ({"model_id": MODEL, "workload": "coding", "passed": 9, "total": 8}, 422, "validation_error", "passed"),
        ({"model_id": MODEL, "workload": "coding", "passed": 0, "total": 0}, 422, "validation_error", "total"),
        ({"model_id": MODEL, "workload": "coding", "passed": 1, "total": 2, "score": 0.5}, 422, "validation_error",
         "score"),
        ({"model_id": MODEL, "workload": "coding", "score": 1.5}, 422, "validation_error", "score"),
        ({"model_id": MODEL, "workload": "coding", "score": -0.1}, 422, "validation_error", "score"),
        ({"model_id": MODEL, "workload": "coding", "passed": 1, "total": 10**9}, 422, "validation_error", "total"),
        ({"model_id": MODEL, "workload": "coding", "score": 1, "latency_ms": -1}, 422, "validation_error",
         "latency_ms"),
        ({"model_id": MODEL, "workload": "coding", "score": 1, "artifact_sha256": "z" * 64}, 422,
         "validation_error", "artifact_sha256"),
        ({"model_id": MODEL, "workload": "coding", "score": 1, "prompt": "hi"}, 422, "validation_error", "prompt"),
    ],
)
async def test_bad_evaluations_are_refused_with_a_clear_error_and_append_nothing(
        ctl: Controller, body: dict, status: int, error: str, field: str) -> None:  # type: ignore[type-arg]
    async with client(ctl, ctl.token) as c:
        r = await c.post("/allocator/evaluations", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"] == error and r.json()["field"] == field, r.json()
    assert await evaluations(ctl.log) == []


async def test_oversized_and_malformed_bodies(ctl: Controller) -> None:
    async with client(ctl, ctl.token) as c:
        r = await c.post("/allocator/evaluations", content=b"{" * 100_000)
        assert r.status_code == 413
        r = await c.post("/allocator/evaluations", content=b"{not json")
        assert r.status_code == 422 and r.json()["error"] == "malformed_json"
        doc = (await c.get("/openapi.json")).json()
    op = doc["paths"]["/allocator/evaluations"]["post"]
    assert op["security"] and {"401", "404", "409", "422"} <= set(op["responses"])
    assert "EvaluationBody" in doc["components"]["schemas"]
    assert await evaluations(ctl.log) == []


async def test_gridctl_model_evaluate(ctl: Controller) -> None:
    admin = await serve_admin(ctl, "127.0.0.1", 0)
    home = ctl.config.home
    try:
        rc, out, err = await gridctl(home, "model", "evaluate", MODEL, "--workload", "coding", "--passed", "7",
                                     "--total", "8", "--latency-ms", "1200", "--artifact-sha256", SHA, "--json")
        assert rc == 0, err
        data = json.loads(out)
        assert data["score"] == pytest.approx(7 / 8) and data["samples"] == 8 and data["artifact_sha256"] == SHA
        rc, out, err = await gridctl(home, "model", "evaluate", MODEL, "--workload", "coding", "--score", "1")
        assert rc == 0 and "score 1.000" in out, out + err
        rc, out, err = await gridctl(home, "model", "evaluate", MODEL, "--workload", "coding", "--score", "1",
                                     "--artifact-sha256", "cd" * 32)
        assert rc != 0 and "409" in err and "artifact_mismatch" in err
        rc, out, err = await gridctl(home, "model", "evaluate", MODEL, "--workload", "coding", "--passed", "1")
        assert rc != 0 and "--total" in err
        rc, out, err = await gridctl(home, "model", "evaluate", MODEL, "--workload", "coding", "--score", "1",
                                     "--token-file", str(home / "missing.token"))
        assert rc != 0
    finally:
        await admin.stop()
    assert [e.samples for e in await evaluations(ctl.log)] == [8, 1]
