"""The admin API's OpenAPI document, generated from the msgspec types it decodes and encodes.

Request bodies are the very decoders' types (grid.controller.api's ProfileBody, ModeBody,
TickBody); responses are the Structs below, which the handlers encode, so the document cannot
drift from what is sent. Status and history rows are open objects: status is a composed view
whose shape is documented in docs, and history rows are the DuckDB views' columns.
"""

from __future__ import annotations

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


def build_openapi(profile_body: type, mode_body: type, tick_body: type, history_views: tuple[str, ...],
                  profile_patch: type, evaluation_body: type | None = None,
                  forecast_window_body: type | None = None) -> dict[str, Any]:
    types = [ErrorBody, ProfileSetResponse, ProfileRetiredResponse, ModeResponse, TickResponse, HistoryResponse,
             profile_body, mode_body, tick_body, profile_patch]
    if evaluation_body is not None:
        types += [EvaluationResponse, evaluation_body]
    window_at = len(types)
    if forecast_window_body is not None:
        types += [ForecastWindowResponse, forecast_window_body]
    types += [DrainCheck]
    refs, components = msgspec.json.schema_components(types, ref_template=REF)
    drain_check_r = refs[-1]
    error, set_r, retired_r, mode_r, tick_r, history_r, profile_b, mode_b, tick_b, patch_b = refs[:10]

    def responses(ok: dict[str, Any], *codes: int) -> dict[str, Any]:
        out: dict[str, Any] = {"200": {"description": "OK", "content": _content(ok)}}
        for code in codes:
            out[str(code)] = {"description": _REASONS[code], "content": _content(error)}
        return out

    token = [{"operatorToken": []}, {"bearer": []}]
    model_param = {"name": "model_id", "in": "path", "required": True,
                   "schema": {"type": "string", "minLength": 1, "maxLength": MODEL_ID_MAX_LENGTH},
                   "description": f"The model id: {MODEL_ID_GRAMMAR}."}
    status_obj = {"type": "object", "additionalProperties": True}
    paths = {
        "/allocator/status": {"get": {
            "summary": "Allocator status (open on loopback; elsewhere the operator or reader token).",
            "responses": responses(status_obj, 401, 404),
        }},
        "/allocator/models/{model_id}": {
            "put": {
                "summary": "Create or replace a model profile (appends ProfileSet).", "security": token,
                "parameters": [model_param],
                "requestBody": {"required": True, "content": _content(profile_b)},
                "responses": responses(set_r, 400, 401, 403, 404, 408, 413, 422, 503),
            },
            "patch": {
                "summary": "Change only the given fields of an existing profile (appends ProfileSet).",
                "security": token, "parameters": [model_param],
                "requestBody": {"required": True, "content": _content(patch_b)},
                "responses": responses(set_r, 400, 401, 403, 404, 408, 413, 422, 503),
            },
            "delete": {
                "summary": "Retire a model profile (appends ProfileRemoved).", "security": token,
                "parameters": [model_param],
                "responses": responses(retired_r, 401, 403, 404, 422, 503),
            },
        },
        "/allocator/mode": {"put": {
            "summary": "Select the allocator mode (appends ModeSet).", "security": token,
            "requestBody": {"required": True, "content": _content(mode_b)},
            "responses": responses(mode_r, 400, 401, 403, 408, 409, 413, 422, 503),
        }},
        "/allocator/tick": {"post": {
            "summary": "Request an immediate reconciliation pass.", "security": token,
            "requestBody": {"required": False, "content": _content(tick_b)},
            "responses": responses(tick_r, 400, 401, 403, 408, 413, 422, 503),
        }},
        "/allocator/history/{view}": {"get": {
            "summary": "A history view of the analytics store (operator or reader token).", "security": token,
            "parameters": [
                {"name": "view", "in": "path", "required": True, "schema": {"type": "string", "enum": list(history_views)}},
                {"name": "from", "in": "query", "schema": {"type": "number"}, "description": "Start, epoch seconds."},
                {"name": "to", "in": "query", "schema": {"type": "number"}, "description": "End, epoch seconds."},
                {"name": "bucket", "in": "query", "schema": {"type": "number", "minimum": 0},
                 "description": "Window length in seconds (demand)."},
                {"name": "model", "in": "query", "schema": {"type": "string"}, "description": "Only this model."},
                {"name": "changes_only", "in": "query", "schema": {"type": "boolean"},
                 "description": "Only plans whose placements changed."},
            ],
            "responses": responses(history_r, 401, 404, 422, 503),
        }},
        **({} if evaluation_body is None else {"/allocator/evaluations": {"post": {
            "summary": "Record an owner's quality evaluation of a configured model on a workload "
                       "(appends EvaluationRecorded; an explicit artifact_sha256 must be the configured revision).",
            "security": token,
            "requestBody": {"required": True, "content": _content(refs[11])},
            "responses": responses(refs[10], 400, 401, 404, 408, 409, 413, 422, 503),
        }}}),
        **({} if forecast_window_body is None else {"/allocator/forecast-window": {"put": {
            "summary": "Set the length of one demand bucket, seconds (appends ForecastWindowSet; the forecast's "
                       "windows are counts of buckets, and the bucketed demand starts afresh at a new length).",
            "security": token,
            "requestBody": {"required": True, "content": _content(refs[window_at + 1])},
            "responses": responses(refs[window_at], 400, 401, 403, 408, 413, 422, 503),
        }}}),
        "/allocator/hosts/{host_id}/drain-check": {"get": {
            "summary": "What draining the host would cost: each model whose last ready copy is there and that no "
                       "other host can take, and what the evacuation deadline does with it (a what-if plan of the "
                       "last planner input; open on loopback, elsewhere the operator or reader token).",
            "parameters": [{"name": "host_id", "in": "path", "required": True,
                            "schema": {"type": "string", "minLength": 1, "maxLength": HOST_ID_MAX_LENGTH},
                            "description": "The host id, as status lists it."}],
            "responses": responses(drain_check_r, 401, 404),
        }},
        "/metrics": {"get": {
            "summary": "Prometheus exposition (open on loopback; elsewhere the operator or reader token).",
            "responses": {"200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}},
                          "401": {"description": _REASONS[401], "content": _content(error)}},
        }},
    }
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
