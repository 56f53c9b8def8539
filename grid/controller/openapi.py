"""The admin API's OpenAPI document, generated from the msgspec types it decodes and encodes.

Request bodies are the very decoders' types (grid.controller.admin_input's ProfileBody, derived
from the profile's declared fields, ModeBody, TickBody, ...); responses are the Structs below,
which the handlers encode, so the document cannot drift from what is sent. Each schema is
referred to by name (`build_openapi`'s table), each route is one `Operation`, and
tests/unit/controller/test_profile_fields.py holds the operations to grid.controller.api's routes.
Status and history rows are open objects: status is a composed view whose shape is documented in
docs, and history rows are the DuckDB views' columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from grid import __version__
from grid.controller.drain_check import DrainCheck
from grid.controller.status import TickReport
from grid.events.control import MODEL_ID_GRAMMAR, MODEL_ID_MAX_LENGTH, ModelProfile

REF = "#/components/schemas/{name}"


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """Every refusal: a reason constant, a sentence, and the field at fault when there is one."""

    error: str
    detail: str
    field: str | None = None


class ProfileSetResponse(msgspec.Struct, frozen=True, kw_only=True):
    model_id: str
    profile: ModelProfile
    seq: int


class ProfileRetiredResponse(msgspec.Struct, frozen=True, kw_only=True):
    model_id: str
    retired: bool
    seq: int


class ModeResponse(msgspec.Struct, frozen=True, kw_only=True):
    mode: str
    seq: int


class ForecastWindowResponse(msgspec.Struct, frozen=True, kw_only=True):
    bucket_seconds: float
    seq: int


class TickResponse(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    tick: TickReport
    actions: int
    deferred: int


class EvaluationResponse(msgspec.Struct, frozen=True, kw_only=True):
    """An appended EvaluationRecorded: what was recorded, for which revision, at which sequence."""

    model_id: str
    workload: str
    score: float
    samples: int
    artifact_sha256: str | None
    seq: int


class HistoryResponse(msgspec.Struct, frozen=True, kw_only=True):
    view: str
    rows: list[dict[str, Any]]


def _content(ref: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": ref}}


# A host id in a path (as gridctl host checks it: no whitespace or control character).
HOST_ID_MAX_LENGTH = 200

# Who may call an operation: the operator token (mutations; reads that are not open on loopback
# accept the reader token too, which the document does not name apart).
TOKEN = [{"operatorToken": []}, {"bearer": []}]


@dataclass(frozen=True)
class Operation:
    """One documented route of the admin API (grid.controller.api.ROUTES). `ok`, `body` and the
    error bodies name schemas of `build_openapi`'s table; `errors` are the refusals it may answer."""

    method: str
    path: str
    summary: str
    ok: str
    errors: tuple[int, ...]
    body: str | None = None
    body_required: bool = True
    parameters: tuple[dict[str, Any], ...] = ()
    secured: bool = True

    def document(self, refs: dict[str, dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"summary": self.summary}
        if self.secured:
            out["security"] = TOKEN
        if self.parameters:
            out["parameters"] = list(self.parameters)
        if self.body is not None:
            out["requestBody"] = {"required": self.body_required, "content": _content(refs[self.body])}
        out["responses"] = {"200": {"description": "OK", "content": _content(refs[self.ok])}}
        for code in self.errors:
            out["responses"][str(code)] = {"description": _REASONS[code], "content": _content(refs["error"])}
        return out


def _operations(history_views: tuple[str, ...], *, evaluations: bool, forecast_window: bool) -> list[Operation]:
    model_param = {"name": "model_id", "in": "path", "required": True,
                   "schema": {"type": "string", "minLength": 1, "maxLength": MODEL_ID_MAX_LENGTH},
                   "description": f"The model id: {MODEL_ID_GRAMMAR}."}
    body_errors = (400, 401, 403, 404, 408, 413, 422, 503)
    ops = [
        Operation("get", "/allocator/status",
                  "Allocator status (open on loopback; elsewhere the operator or reader token).",
                  ok="status", errors=(401, 404), secured=False),
        Operation("put", "/allocator/models/{model_id}", "Create or replace a model profile (appends ProfileSet).",
                  ok="profile_set", errors=body_errors, body="profile", parameters=(model_param,)),
        Operation("patch", "/allocator/models/{model_id}",
                  "Change only the given fields of an existing profile (appends ProfileSet).",
                  ok="profile_set", errors=body_errors, body="profile_patch", parameters=(model_param,)),
        Operation("delete", "/allocator/models/{model_id}", "Retire a model profile (appends ProfileRemoved).",
                  ok="profile_retired", errors=(401, 403, 404, 422, 503), parameters=(model_param,)),
        Operation("put", "/allocator/mode", "Select the allocator mode (appends ModeSet).",
                  ok="mode_set", errors=(400, 401, 403, 408, 409, 413, 422, 503), body="mode"),
        Operation("post", "/allocator/tick", "Request an immediate reconciliation pass.",
                  ok="tick_done", errors=(400, 401, 403, 408, 413, 422, 503), body="tick", body_required=False),
        Operation("get", "/allocator/history/{view}",
                  "A history view of the analytics store (operator or reader token).",
                  ok="history", errors=(401, 404, 422, 503), parameters=(
                      {"name": "view", "in": "path", "required": True,
                       "schema": {"type": "string", "enum": list(history_views)}},
                      {"name": "from", "in": "query", "schema": {"type": "number"},
                       "description": "Start, epoch seconds."},
                      {"name": "to", "in": "query", "schema": {"type": "number"}, "description": "End, epoch seconds."},
                      {"name": "bucket", "in": "query", "schema": {"type": "number", "minimum": 0},
                       "description": "Window length in seconds (demand)."},
                      {"name": "model", "in": "query", "schema": {"type": "string"}, "description": "Only this model."},
                      {"name": "changes_only", "in": "query", "schema": {"type": "boolean"},
                       "description": "Only plans whose placements changed."},
                  )),
    ]
    if evaluations:
        ops.append(Operation(
            "post", "/allocator/evaluations",
            "Record an owner's quality evaluation of a configured model on a workload "
            "(appends EvaluationRecorded; an explicit artifact_sha256 must be the configured revision).",
            ok="evaluation_recorded", errors=(400, 401, 404, 408, 409, 413, 422, 503), body="evaluation"))
    if forecast_window:
        ops.append(Operation(
            "put", "/allocator/forecast-window",
            "Set the length of one demand bucket, seconds (appends ForecastWindowSet; the forecast's "
            "windows are counts of buckets, and the bucketed demand starts afresh at a new length).",
            ok="forecast_window_set", errors=(400, 401, 403, 408, 413, 422, 503), body="forecast_window"))
    ops.append(Operation(
        "get", "/allocator/hosts/{host_id}/drain-check",
        "What draining the host would cost: each model whose last ready copy is there and that no "
        "other host can take, and what the evacuation deadline does with it (a what-if plan of the "
        "last planner input; open on loopback, elsewhere the operator or reader token).",
        ok="drain_check", errors=(401, 404), secured=False,
        parameters=({"name": "host_id", "in": "path", "required": True,
                     "schema": {"type": "string", "minLength": 1, "maxLength": HOST_ID_MAX_LENGTH},
                     "description": "The host id, as status lists it."},)))
    return ops


def _schemas(types: dict[str, type]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Each type's schema reference by its name in `types`, and the components they refer to."""
    refs, components = msgspec.json.schema_components(list(types.values()), ref_template=REF)
    return dict(zip(types, refs)), components


def build_openapi(profile_body: type, mode_body: type, tick_body: type, history_views: tuple[str, ...],
                  profile_patch: type, evaluation_body: type | None = None,
                  forecast_window_body: type | None = None) -> dict[str, Any]:
    types: dict[str, type] = {
        "error": ErrorBody, "profile_set": ProfileSetResponse, "profile_retired": ProfileRetiredResponse,
        "mode_set": ModeResponse, "tick_done": TickResponse, "history": HistoryResponse,
        "profile": profile_body, "mode": mode_body, "tick": tick_body, "profile_patch": profile_patch,
        "drain_check": DrainCheck,
    }
    if evaluation_body is not None:
        types.update(evaluation_recorded=EvaluationResponse, evaluation=evaluation_body)
    if forecast_window_body is not None:
        types.update(forecast_window_set=ForecastWindowResponse, forecast_window=forecast_window_body)
    refs, components = _schemas(types)
    # Status is a composed view documented in docs: an open object here.
    refs["status"] = {"type": "object", "additionalProperties": True}
    paths: dict[str, dict[str, Any]] = {}
    for op in _operations(history_views, evaluations=evaluation_body is not None,
                          forecast_window=forecast_window_body is not None):
        paths.setdefault(op.path, {})[op.method] = op.document(refs)
    paths["/metrics"] = {"get": {
        "summary": "Prometheus exposition (open on loopback; elsewhere the operator or reader token).",
        "responses": {"200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}},
                      "401": {"description": _REASONS[401], "content": _content(refs["error"])}},
    }}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Grid admin API", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "operatorToken": {"type": "apiKey", "in": "header", "name": "X-Grid-Allocator-Token"},
                "bearer": {"type": "http", "scheme": "bearer"},
            },
        },
    }


_REASONS = {
    400: "Bad request (for example a malformed Content-Length)",
    401: "Operator token missing or wrong",
    403: "The reader token may only read; this needs the operator token",
    404: "No such model, view or path",
    408: "The request body did not arrive in time",
    409: "Refused in the current state (automatic mode on a non-durable log, an evaluation naming "
         "another artifact revision)",
    413: "Body too large",
    422: "Validation error, naming the field and what it accepts (a string, list or map beyond its "
         "bound, an artifact_source scheme other than hf://, https:// or http://)",
    503: "The event log or the analytics store is unavailable, or too many bodies are still arriving",
}
