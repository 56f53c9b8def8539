"""Issue 37's admin items: hostile profile bodies and paths get the admin API's JSON error naming
what is wrong and what is accepted, and nothing reaches the log. Real sockets against the real
admin server (uvicorn) of a real controller on a real JetStream log."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from grid.controller.admin_input import (
    MAX_MODEL_ID_LENGTH,
    MAX_NAME_LENGTH,
    MAX_PROFILE_ITEMS,
    MAX_SOURCE_LENGTH,
    MAX_WORKLOAD_NAME_LENGTH,
)
from grid.controller.api import AdminServer, serve_admin
from grid.controller.service import Controller
from grid.events.control import ProfileSet
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.test_admin_api import control_events
from tests.integration.controller.test_cli_admin import SETTINGS

SHA = "ab" * 32
LONG = "x" * 10_000  # what the operator stored by hand: 10 KB in one list item or workload key


class Admin:
    def __init__(self, ctl: Controller, server: AdminServer, http: httpx.AsyncClient) -> None:
        self.ctl, self.server, self.http = ctl, server, http

    @property
    def port(self) -> int:
        return int((self.server.url or "").rsplit(":", 1)[1])

    async def nothing_appended(self) -> None:
        assert await control_events(self.ctl.log) == []  # type: ignore[arg-type]
        assert self.ctl.runner["catalog"].profiles == {}


@pytest.fixture
async def admin(js_log: JetStreamLog, tmp_path: Path) -> AsyncIterator[Admin]:
    ctl = Controller(js_log, tmp_path / "home", settings=SETTINGS, controller_id="ctl-hostile-input")
    await ctl.start()
    server = await serve_admin(ctl, "127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(base_url=server.url or "", timeout=10,
                                     headers={"X-Grid-Allocator-Token": ctl.token or ""}) as http:
            yield Admin(ctl, server, http)
    finally:
        await server.stop()
        await ctl.stop()


def refused(r: httpx.Response, status: int, field: str | None, *needles: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) <= {"error", "detail", "field"} and body["error"] and body["detail"], body
    assert body.get("field") == field, body
    for needle in needles:
        assert needle in body["detail"], body
    assert LONG not in r.text  # the refusal never echoes the hostile value
    return body  # type: ignore[no-any-return]


OVERLONG: list[tuple[dict[str, Any], str, int]] = [
    ({"runtimes": ["llama.cpp", LONG]}, "runtimes", MAX_NAME_LENGTH),
    ({"backends": [LONG]}, "backends", MAX_NAME_LENGTH),
    ({"required_tags": [LONG]}, "required_tags", MAX_NAME_LENGTH),
    ({"forbidden_tags": [LONG]}, "forbidden_tags", MAX_NAME_LENGTH),
    ({"allow_hosts": [LONG]}, "allow_hosts", MAX_NAME_LENGTH),
    ({"deny_hosts": [LONG]}, "deny_hosts", MAX_NAME_LENGTH),
    ({"pins": [LONG]}, "pins", MAX_NAME_LENGTH),
    ({"colocation_excludes": [LONG]}, "colocation_excludes", MAX_NAME_LENGTH),
    ({"runtime_memory_mb": {LONG: 100}}, "runtime_memory_mb", MAX_NAME_LENGTH),
    ({"workload_scores": {LONG: 0.5}}, "workload_scores", MAX_WORKLOAD_NAME_LENGTH),
    ({"workload_scores": {"c" * (MAX_WORKLOAD_NAME_LENGTH + 1): 0.5}}, "workload_scores", MAX_WORKLOAD_NAME_LENGTH),
    ({"artifact_sha256": SHA, "artifact_size_mb": 5,
      "artifact_source": "https://h/" + "a" * MAX_SOURCE_LENGTH + ".gguf"}, "artifact_source", MAX_SOURCE_LENGTH),
    ({"required_tags": [f"t{i}" for i in range(MAX_PROFILE_ITEMS + 1)]}, "required_tags", MAX_PROFILE_ITEMS),
    ({"workload_scores": {f"w{i}": 0.5 for i in range(MAX_PROFILE_ITEMS + 1)}}, "workload_scores",
     MAX_PROFILE_ITEMS),
]


@pytest.mark.parametrize(("extra", "field", "bound"), OVERLONG,
                         ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(OVERLONG)])
async def test_overlong_strings_and_lists_are_422_naming_the_bound(
        admin: Admin, extra: dict[str, Any], field: str, bound: int) -> None:
    r = await admin.http.put("/allocator/models/m", json={"memory_mb": 100, **extra})
    refused(r, 422, field, f"length <= {bound}")
    # A partial update is held to the same bounds (the model exists, the patch is refused).
    assert (await admin.http.put("/allocator/models/m", json={"memory_mb": 100})).status_code == 200
    r = await admin.http.patch("/allocator/models/m", json=extra)
    refused(r, 422, field, f"length <= {bound}")
    events = await control_events(admin.ctl.log)  # type: ignore[arg-type]
    assert [type(e) for e in events] == [ProfileSet]  # the refused ones appended nothing
    assert events[0].profile.runtimes == ("llama.cpp",) and events[0].profile.workload_scores == {}


async def test_names_at_their_bounds_are_accepted(admin: Admin) -> None:
    body = {"memory_mb": 100, "runtimes": ["r" * MAX_NAME_LENGTH], "pins": ["h" * MAX_NAME_LENGTH],
            "workload_scores": {"w" * MAX_WORKLOAD_NAME_LENGTH: 0.5},
            "required_tags": [f"t{i}" for i in range(MAX_PROFILE_ITEMS)]}
    r = await admin.http.put("/allocator/models/m", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["profile"]["pins"] == ["h" * MAX_NAME_LENGTH]


@pytest.mark.parametrize("source", [
    "file:///etc/passwd",
    "FILE:///etc/shadow",
    "file://localhost/etc/passwd",
    "ftp://mirror.example/m.gguf",
    "gopher://h/m.gguf",
    "s3://bucket/m.gguf",
    "/etc/passwd",
    "hf://owner/repo/../../etc/passwd.gguf",
    "hf://owner/repo/model.bin",
    "https://h/m.gguf\n",
])
async def test_artifact_sources_outside_the_accepted_schemes_are_422(admin: Admin, source: str) -> None:
    body = {"memory_mb": 100, "artifact_sha256": SHA, "artifact_size_mb": 5, "artifact_source": source}
    r = await admin.http.put("/allocator/models/m", json=body)
    detail = refused(r, 422, "artifact_source")["detail"]
    if source.lower().startswith(("file:", "ftp:", "gopher:", "s3:", "/")):
        assert "hf://, https://, http://" in detail, detail
    if source.lower().startswith("file:"):
        assert "file:// sources are refused" in detail and "artifact store" in detail, detail
    await admin.nothing_appended()


async def test_accepted_artifact_sources_still_set_a_profile(admin: Admin) -> None:
    for i, source in enumerate(("hf://owner/repo@rev/dir/model.Q4.gguf", "https://models.example/m.gguf",
                                "http://127.0.0.1:8000/m.gguf")):
        body = {"memory_mb": 100, "artifact_sha256": SHA, "artifact_size_mb": 5, "artifact_source": source}
        r = await admin.http.put(f"/allocator/models/m{i}", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["profile"]["artifact_source"] == source
    # No source at all: the digest is fetched from the grid's artifact store.
    r = await admin.http.put("/allocator/models/store", json={"memory_mb": 100, "artifact_sha256": SHA})
    assert r.status_code == 200, r.text


async def _raw(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_dot_and_empty_model_paths_are_refused_not_redirected(admin: Admin) -> None:
    body = {"memory_mb": 100}
    # httpx (like curl and browsers) removes the dot segment: the path becomes /allocator/models.
    for method in ("PUT", "PATCH", "DELETE"):
        r = await admin.http.request(method, "/allocator/models/.", json=body if method != "DELETE" else None)
        assert r.request.url.path == "/allocator/models"
        refused(r, 404, "model_id", "/allocator/models/{model_id}", "letters, digits")
    refused(await admin.http.put("/allocator/models/", json=body), 422, "model_id", "letters, digits")
    # Sent verbatim, the dot (and the dot-dot) reach the model id's grammar.
    token = (admin.ctl.token or "").encode()
    for path in (b"/allocator/models/.", b"/allocator/models/..", b"/allocator/models/./x"):
        payload = b'{"memory_mb": 100}'
        raw = await _raw(admin.port, b"PUT " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"X-Grid-Allocator-Token: " + token + b"\r\nContent-Length: "
                         + str(len(payload)).encode() + b"\r\nConnection: close\r\n\r\n" + payload)
        status_line = raw.split(b"\r\n", 1)[0]
        assert b" 422 " in status_line, raw[:300]
        assert b'"field":"model_id"' in raw, raw[:300]
    # No path of the admin API answers with a redirect.
    for method, path in (("PUT", "/allocator/mode/"), ("POST", "/allocator/tick/"), ("GET", "/allocator/status/")):
        r = await admin.http.request(method, path, json={"mode": "observe"} if method == "PUT" else None)
        refused(r, 404, None, "no such resource")
    # Without the token, the id-less path is refused like any mutation.
    async with httpx.AsyncClient(base_url=admin.server.url or "", timeout=10) as anonymous:
        assert (await anonymous.put("/allocator/models/.", json=body)).status_code == 401
    await admin.nothing_appended()


async def test_the_openapi_document_states_the_bounds(admin: Admin) -> None:
    """The schema schemathesis fuzzes is generated from the very types that refuse: in step."""
    doc = (await admin.http.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    for name in ("ProfileBody", "ProfilePatch"):
        props = schemas[name]["properties"]
        for field in ("runtimes", "backends", "required_tags", "forbidden_tags", "allow_hosts", "deny_hosts",
                      "pins", "colocation_excludes"):
            assert props[field]["items"]["maxLength"] == MAX_NAME_LENGTH, (name, field)
            assert props[field]["maxItems"] == MAX_PROFILE_ITEMS, (name, field)
        assert props["workload_scores"]["propertyNames"]["maxLength"] == MAX_WORKLOAD_NAME_LENGTH
        assert props["workload_scores"]["maxProperties"] == MAX_PROFILE_ITEMS
        assert props["runtime_memory_mb"]["propertyNames"]["maxLength"] == MAX_NAME_LENGTH
        source = next(s for s in props["artifact_source"]["anyOf"] if s.get("type") == "string")
        assert source["maxLength"] == MAX_SOURCE_LENGTH
    put = doc["paths"]["/allocator/models/{model_id}"]["put"]
    assert put["parameters"][0]["schema"]["maxLength"] == MAX_MODEL_ID_LENGTH and "422" in put["responses"]
