"""Profile numbers are bounded by what any machine can have, and model ids follow one grammar
(grid.events.control), at the admin API, in gridctl before it sends, and in the event decoder.
Real admin server, gridctl's own code (run in this process: thirty process starts made this the
slowest test of its directory, and cost minutes on a loaded machine), real NATS log.

Incident (issue 25): the admin API accepted memory_mb 10^35, min_replicas 10^6, context_size
10^12, and a model named `../../etc/passwd` that `gridctl model rm` then could not remove.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import pytest
from typer.testing import CliRunner

from grid.cli.main import app
from grid.controller.api import AdminServer, serve_admin
from grid.controller.service import Controller
from grid.events.control import ModelProfile, ProfileSet
from grid.events.subjects import profile_subject
from grid.projections.runner import ProjectionRunner
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.test_cli_admin import SETTINGS

BAD_VALUES = [
    ("memory_mb", 10 ** 35, "<= 16777216"),
    ("memory_mb", 16 * 1024 * 1024 + 1, "<= 16777216"),
    ("min_replicas", 10 ** 6, "<= 4096"),
    ("max_replicas", 4097, "<= 4096"),
    ("context_size", 10 ** 12, "<= 16777216"),
    ("replica_concurrency", 1025, "<= 1024"),
    ("min_gpu_count", 10 ** 9, "<= 256"),
    ("min_gpu_memory_mb", 10 ** 12, "<= 16777216"),
    ("artifact_size_mb", 10 ** 12, "<= 16777216"),
    ("priority", 10 ** 18, "<= 1000000"),
    ("load_seconds", 1e300, "<= 604800"),
    ("latency_slo_ms", 1e300, "<= 604800000"),
]
BAD_IDS = ["../../etc/passwd", "..", "org/model.gguf", ".hidden", "-flag", "a b", "tab\there", "nl\n",
           "x" * 129, "café.gguf"]
VALID_IDS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "m", "gpt-oss:20b", "Qwen2.5-7B+lora_v1", "x" * 128, "0.gguf"]


async def gridctl(home: Path, *args: str) -> tuple[int, str, str]:
    """`gridctl ARGS` with GRID_HOME=home, in a thread so the admin server on this loop answers."""
    env = {"GRID_HOME": str(home), "GRID_ADMIN_URL": None, "COLUMNS": "200"}
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
async def admin(js_log: JetStreamLog, tmp_path: Path) -> AsyncIterator[tuple[Controller, AdminServer]]:
    ctl = Controller(js_log, tmp_path / "home", settings=SETTINGS, controller_id="ctl-values")
    await ctl.start()
    server = await serve_admin(ctl, "127.0.0.1", 0)
    yield ctl, server
    await server.stop()
    await ctl.stop()


async def test_the_api_refuses_each_bad_value_and_id_naming_the_field_and_bound(admin) -> None:
    ctl, server = admin
    headers = {"X-Grid-Allocator-Token": ctl.token or ""}
    async with httpx.AsyncClient(base_url=server.url or "", headers=headers, timeout=5) as c:
        for field, value, bound in BAD_VALUES:
            body = {"memory_mb": 100, field: value}
            r = await c.put("/allocator/models/m.gguf", content=json.dumps(body))
            assert r.status_code == 422, (field, r.text)
            err = r.json()
            assert err["field"] == field and bound in err["detail"] and field in err["detail"], err
        assert (await c.put("/allocator/models/m.gguf", json={"memory_mb": 100})).status_code == 200
        # A partial update is held to the same bounds.
        for field, value, bound in BAD_VALUES:
            r = await c.patch("/allocator/models/m.gguf", content=json.dumps({field: value}))
            assert r.status_code == 422 and r.json()["field"] == field and bound in r.json()["detail"], r.text
        for bad in BAD_IDS:
            # Percent-encoded, so no client normalises the dot segments away before they arrive.
            path = "/allocator/models/" + "".join(f"%{b:02X}" for b in bad.encode())
            for method in ("PUT", "DELETE"):
                r = await c.request(method, path, json={"memory_mb": 1})
                assert r.status_code in (404, 422), (bad, r.text)
                if r.status_code == 422:
                    assert r.json()["field"] == "model_id" and "letters, digits" in r.json()["detail"]
        # Only m.gguf was ever recorded, at its original bounds.
        status = (await c.get("/allocator/status")).json()
        assert [p["model_id"] for p in status["profiles"]] == ["m.gguf"]
        assert status["profiles"][0]["memory_mb"] == 100


async def test_gridctl_refuses_before_sending_and_removes_every_valid_id(admin, tmp_path: Path) -> None:
    ctl, server = admin
    home = tmp_path / "home"
    nowhere = "http://127.0.0.1:9"  # nothing listens: a refusal naming the bound was made before sending
    for field, value, bound in BAD_VALUES:
        option = "--" + field.replace("_", "-")
        args = ["model", "set", "m.gguf", "--admin", nowhere, option, str(value)]
        if field != "memory_mb":
            args += ["--memory-mb", "100"]
        rc, out, err = await gridctl(home, *args)
        assert rc != 0 and option in err and bound in err, (field, err)
    for bad in ("../../etc/passwd", "org/model.gguf", ".hidden"):
        for args in (["model", "set", bad, "--memory-mb", "100"], ["model", "rm", bad]):
            rc, out, err = await gridctl(home, *args[:2], "--admin", nowhere, *args[2:])
            assert rc != 0 and "letters, digits" in err, (bad, err)
    # Every valid id can be set and removed through gridctl.
    for model_id in VALID_IDS:
        rc, out, err = await gridctl(home, "model", "set", model_id, "--memory-mb", "100", "--context-size",
                                     str(2 ** 24), "--min-replicas", "0", "--max-replicas", "4096")
        assert rc == 0, (model_id, err)
        assert ctl.runner["catalog"].profiles[model_id].context_size == 2 ** 24
        rc, out, err = await gridctl(home, "model", "rm", model_id)
        assert rc == 0, (model_id, err)
        assert model_id in ctl.runner["catalog"].retired and model_id not in ctl.runner["catalog"].profiles


async def test_a_profile_event_beyond_a_bound_is_skipped_as_malformed(js_log: JetStreamLog) -> None:
    good = ProfileSet(event_id="good", at=0, profile=ModelProfile(model_id="ok.gguf", memory_mb=100))
    await js_log.append(good)
    raw = msgspec.to_builtins(good)
    cases = {"memory_mb": 10 ** 35, "min_replicas": 10 ** 6, "context_size": 10 ** 12}
    for i, (field, value) in enumerate(cases.items()):
        bad = {**raw, "event_id": f"bad-{i}", "profile": {**raw["profile"], "model_id": f"bad{i}.gguf", field: value}}
        await js_log.append_raw(profile_subject(f"bad{i}.gguf"), json.dumps(bad).encode(), msg_id=f"bad-{i}")
    named = {**raw, "event_id": "bad-id", "profile": {**raw["profile"], "model_id": "../../etc/passwd"}}
    await js_log.append_raw(profile_subject("x"), json.dumps(named).encode(), msg_id="bad-id")
    runner = ProjectionRunner()
    await runner.catch_up(js_log)
    assert sorted(runner["catalog"].profiles) == ["ok.gguf"]
    assert runner.malformed == len(cases) + 1
