"""Admin HTTP API (Starlette): allocator status and operator mutations.

    GET    /allocator/status            open on loopback; elsewhere needs the operator token
    PUT    /allocator/models/{model_id} body = ModelProfile fields minus model_id -> ProfileSet
    DELETE /allocator/models/{model_id} -> ProfileRemoved (durable retirement tombstone)
    PUT    /allocator/mode              {"mode": "observe"|"recommend"|"automatic"} -> ModeSet
    POST   /allocator/tick              -> TickRequested, then one reconciliation pass

Mutations need the operator token in ``X-Grid-Allocator-Token`` or ``Authorization: Bearer``
(constant-time compare); a wrong or missing token is 401. Bodies are bounded (413). A malformed
body is 422 naming the field at fault, and nothing is appended. Automatic mode is refused with
409 while the event log is not durable.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from grid.events.base import new_event_id
from grid.events.control import DATA_TIERS, MODES, ModelProfile, ModeSet, ProfileRemoved, ProfileSet, TickRequested
from grid.events.log import LogError
from grid.secrets import tokens_equal

if TYPE_CHECKING:
    from grid.controller.service import Controller

MAX_BODY_BYTES = 64 * 1024
MAX_MODEL_ID_LENGTH = 256
TOKEN_HEADER = "x-grid-allocator-token"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MODEL_ID = re.compile(r"^[^\s\x00-\x1f\x7f]+$")
_SOURCE_SCHEMES = ("hf://", "https://", "http://", "file://")


def _body_struct() -> type:
    """ModelProfile's fields minus model_id, strict about unknown fields (kept in sync)."""
    fields = []
    for f in msgspec.structs.fields(ModelProfile):
        if f.name == "model_id":
            continue
        if f.required:
            fields.append((f.name, f.type))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, f.type, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, f.type, f.default))
    return msgspec.defstruct("ProfileBody", fields, kw_only=True, forbid_unknown_fields=True, frozen=True)


ProfileBody = _body_struct()
_profile_decoder = msgspec.json.Decoder(ProfileBody)


class ModeBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    mode: str


class TickBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    reason: str = ""


class BodyError(Exception):
    def __init__(self, status: int, error: str, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail, self.field = status, error, detail, field


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(data), status_code=status, media_type="application/json", headers=headers)


def _error(status: int, error: str, detail: str, field: str | None = None,
           headers: dict[str, str] | None = None) -> Response:
    body: dict[str, Any] = {"error": error, "detail": detail}
    if field is not None:
        body["field"] = field
    return _json(body, status, headers)


_FIELD_AT = re.compile(r"at `\$\.?([^`]*)`")
_FIELD_NAMED = re.compile(r"field `([^`]+)`")


def _field_from(message: str) -> str | None:
    """The top-level body field a msgspec error names ("$.runtime_memory_mb['x']" -> runtime_memory_mb)."""
    m = _FIELD_NAMED.search(message)
    if m and "unknown field" in message or m and "missing required" in message:
        return m.group(1)
    m = _FIELD_AT.search(message)
    if m:
        path = m.group(1)
        return re.split(r"[.\[]", path, maxsplit=1)[0] or None
    return None


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise BodyError(413, "body_too_large", f"body exceeds {limit} bytes")
        except ValueError:
            raise BodyError(400, "bad_content_length", "Content-Length is not a number") from None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyError(413, "body_too_large", f"body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(decoder: msgspec.json.Decoder, data: bytes) -> Any:
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise BodyError(422, "validation_error", str(exc), _field_from(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise BodyError(422, "malformed_json", str(exc), _field_from(str(exc))) from None


def _invalid(field: str, detail: str) -> BodyError:
    return BodyError(422, "validation_error", detail, field)


def validate_model_id(model_id: str) -> None:
    if not model_id or len(model_id) > MAX_MODEL_ID_LENGTH or not _MODEL_ID.match(model_id):
        raise _invalid("model_id", f"model id must be 1-{MAX_MODEL_ID_LENGTH} printable characters without "
                                   "whitespace")


def _finite(field: str, value: float, *, low: float | None = None, low_open: bool = False,
            high: float | None = None) -> None:
    if not math.isfinite(value):
        raise _invalid(field, "must be a finite number")
    if low is not None and (value <= low if low_open else value < low):
        raise _invalid(field, f"must be {'>' if low_open else '>='} {low}")
    if high is not None and value > high:
        raise _invalid(field, f"must be <= {high}")


def validate_profile(model_id: str, body: Any) -> ModelProfile:
    """Semantic checks beyond types; returns the canonical profile (sha256 lowercased)."""
    validate_model_id(model_id)
    if body.memory_mb <= 0:
        raise _invalid("memory_mb", "must be > 0 (resident runtime budget of one replica, MB)")
    if not body.runtimes:
        raise _invalid("runtimes", "at least one runtime is required")
    for name in body.runtimes:
        if not name.strip():
            raise _invalid("runtimes", "runtime names must not be empty")
    for runtime, mb in sorted(body.runtime_memory_mb.items()):
        if not runtime.strip():
            raise _invalid("runtime_memory_mb", "runtime names must not be empty")
        if mb <= 0:
            raise _invalid("runtime_memory_mb", f"{runtime}: must be > 0")
    sha = body.artifact_sha256
    if sha is not None:
        sha = sha.strip().lower()
        if not _SHA256.match(sha):
            raise _invalid("artifact_sha256", "must be 64 hexadecimal characters")
    if body.artifact_size_mb is not None and body.artifact_size_mb <= 0:
        raise _invalid("artifact_size_mb", "must be > 0")
    source = body.artifact_source
    if source is not None:
        if sha is None:
            raise _invalid("artifact_sha256", "artifact_source requires artifact_sha256")
        if body.artifact_size_mb is None:
            raise _invalid("artifact_size_mb", "artifact_source requires artifact_size_mb")
        if not source.startswith(_SOURCE_SCHEMES):
            raise _invalid("artifact_source", f"scheme must be one of {', '.join(_SOURCE_SCHEMES)}")
        authority = source.split("://", 1)[1].split("/", 1)[0]
        if "@" in authority:
            raise _invalid("artifact_source", "credentials do not belong in the source URI")
    if body.min_replicas < 0:
        raise _invalid("min_replicas", "must be >= 0")
    if body.max_replicas < 0:
        raise _invalid("max_replicas", "must be >= 0")
    if body.max_replicas < body.min_replicas:
        raise _invalid("max_replicas", "must be >= min_replicas")
    if body.data_tier not in DATA_TIERS:
        raise _invalid("data_tier", f"must be one of {', '.join(DATA_TIERS)}")
    if body.min_failure_domains < 1:
        raise _invalid("min_failure_domains", "must be >= 1")
    if body.max_colocated_models < 0:
        raise _invalid("max_colocated_models", "must be >= 0 (0 means unlimited)")
    if model_id in body.colocation_excludes:
        raise _invalid("colocation_excludes", "a model cannot exclude itself")
    for workload, score in sorted(body.workload_scores.items()):
        if not workload.strip():
            raise _invalid("workload_scores", "workload names must not be empty")
        if not (math.isfinite(score) and 0.0 < score <= 1.0):
            raise _invalid("workload_scores", f"{workload}: score must be in (0, 1]")
    _finite("target_utilization", body.target_utilization, low=0.0, low_open=True, high=1.0)
    _finite("expected_service_seconds", body.expected_service_seconds, low=0.0, low_open=True)
    if body.latency_slo_ms is not None:
        _finite("latency_slo_ms", body.latency_slo_ms, low=0.0, low_open=True)
    if body.replica_concurrency < 1:
        raise _invalid("replica_concurrency", "must be >= 1")
    for name in ("load_seconds", "warm_seconds", "min_residency_seconds", "scale_down_cooldown_seconds"):
        _finite(name, getattr(body, name), low=0.0)
    if body.min_gpu_count < 0:
        raise _invalid("min_gpu_count", "must be >= 0")
    if body.min_gpu_memory_mb < 0:
        raise _invalid("min_gpu_memory_mb", "must be >= 0")
    if body.context_size <= 0:
        raise _invalid("context_size", "must be > 0")
    values = {f.name: getattr(body, f.name) for f in msgspec.structs.fields(body)}
    values["artifact_sha256"] = sha
    return ModelProfile(model_id=model_id, **values)


def create_admin_app(
    controller: "Controller",
    token: str,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    status_requires_token_off_loopback: bool = True,
) -> Starlette:
    if not token:
        raise ValueError("the operator token must not be empty")

    def authorized(request: Request) -> bool:
        supplied = request.headers.get(TOKEN_HEADER)
        if supplied is None:
            auth = request.headers.get("authorization", "")
            if auth[:7].lower() == "bearer ":
                supplied = auth[7:].strip()
        return supplied is not None and tokens_equal(supplied, token)

    def unauthorized() -> Response:
        return _error(401, "unauthorized", "operator token required (X-Grid-Allocator-Token or Bearer)",
                      headers={"WWW-Authenticate": "Bearer"})

    def loopback(request: Request) -> bool:
        client = request.client
        return client is not None and client.host in LOOPBACK_HOSTS

    def now() -> float:
        return controller.clock.now()

    async def status(request: Request) -> Response:
        if status_requires_token_off_loopback and not loopback(request) and not authorized(request):
            return unauthorized()
        return _json(controller.status())

    async def put_model(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        model_id = request.path_params["model_id"]
        try:
            validate_model_id(model_id)
            body = _decode(_profile_decoder, await _read_body(request, max_body_bytes))
            profile = validate_profile(model_id, body)
        except BodyError as exc:
            return _error(exc.status, exc.error, exc.detail, exc.field)
        event = ProfileSet(event_id=new_event_id(), at=now(), profile=profile)
        try:
            res = await controller.append_control(event)
        except LogError as exc:
            return _error(503, "log_unavailable", str(exc))
        return _json({"model_id": model_id, "profile": msgspec.to_builtins(profile), "seq": res.seq})

    async def delete_model(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        model_id = request.path_params["model_id"]
        try:
            validate_model_id(model_id)
        except BodyError as exc:
            return _error(exc.status, exc.error, exc.detail, exc.field)
        if model_id not in controller.runner["catalog"].profiles:
            return _error(404, "unknown_model", f"no profile for {model_id!r}", "model_id")
        try:
            res = await controller.append_control(ProfileRemoved(event_id=new_event_id(), at=now(), model_id=model_id))
        except LogError as exc:
            return _error(503, "log_unavailable", str(exc))
        return _json({"model_id": model_id, "retired": True, "seq": res.seq})

    async def put_mode(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        try:
            body = _decode(msgspec.json.Decoder(ModeBody), await _read_body(request, max_body_bytes))
        except BodyError as exc:
            return _error(exc.status, exc.error, exc.detail, exc.field)
        if body.mode not in MODES:
            return _error(422, "validation_error", f"mode must be one of {', '.join(MODES)}", "mode")
        if body.mode == "automatic" and not getattr(controller.log, "durable", False):
            return _error(409, "log_not_durable",
                          "automatic mode is refused: the event log is not durable (mutations would run "
                          "with non-durable intent)", "mode")
        try:
            res = await controller.append_control(ModeSet(event_id=new_event_id(), at=now(), mode=body.mode))  # type: ignore[arg-type]
        except LogError as exc:
            return _error(503, "log_unavailable", str(exc))
        return _json({"mode": body.mode, "seq": res.seq})

    async def post_tick(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        try:
            raw = await _read_body(request, max_body_bytes)
            body = _decode(msgspec.json.Decoder(TickBody), raw) if raw.strip() else TickBody()
        except BodyError as exc:
            return _error(exc.status, exc.error, exc.detail, exc.field)
        try:
            res = await controller.append_control(TickRequested(event_id=new_event_id(), at=now(), reason=body.reason[:200]))
            report = await controller.tick("requested")
        except LogError as exc:
            return _error(503, "log_unavailable", str(exc))
        result = controller.last_result
        return _json({
            "seq": res.seq,
            "tick": msgspec.to_builtins(report),
            "actions": len(result.actions) if result is not None else 0,
            "deferred": len(result.deferred) if result is not None else 0,
        })

    routes = [
        Route("/allocator/status", status, methods=["GET"]),
        Route("/allocator/models/{model_id:path}", put_model, methods=["PUT"]),
        Route("/allocator/models/{model_id:path}", delete_model, methods=["DELETE"]),
        Route("/allocator/mode", put_mode, methods=["PUT"]),
        Route("/allocator/tick", post_tick, methods=["POST"]),
    ]
    return Starlette(routes=routes)
