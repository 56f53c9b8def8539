"""OpenAI-shaped error bodies: {"error": {"message", "type", "param", "code"}}.

Every refusal the gateway makes is one of these values with a stable `code` constant; the
message never echoes request content (a hostile body must not be reflected back).
"""

from __future__ import annotations

import math

import msgspec
from starlette.responses import Response

# The machine-readable reason of a refusal that has one (a planner or gateway REASON constant).
REASON_HEADER = "X-Grid-Reason"

# type
INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
RATE_LIMIT = "rate_limit_error"
SERVER_ERROR = "server_error"
UNAVAILABLE = "service_unavailable_error"

# code
CODE_INVALID_JSON = "invalid_json"
CODE_INVALID_BODY = "invalid_request_body"
CODE_BODY_TOO_LARGE = "request_too_large"
CODE_BODY_TIMEOUT = "request_body_timeout"
CODE_TOO_MANY_INCOMPLETE = "too_many_incomplete_requests"
CODE_OUT_OF_RANGE = "value_out_of_range"
CODE_INVALID_API_KEY = "invalid_api_key"
CODE_EVALUATION_NOT_ALLOWED = "evaluation_not_allowed"
PERMISSION = "permission_error"
CODE_MODEL_NOT_FOUND = "model_not_found"
CODE_INVALID_AFFINITY = "invalid_affinity_key"
CODE_NO_READY_REPLICA = "model_not_ready"
CODE_AT_CAPACITY = "model_at_capacity"
CODE_CIRCUIT_OPEN = "upstream_unavailable"
CODE_UPSTREAM_ERROR = "upstream_error"
CODE_UPSTREAM_TIMEOUT = "upstream_timeout"
CODE_UPSTREAM_CONNECTION_LOST = "upstream_connection_lost"
CODE_UPSTREAM_SILENT = "upstream_silent"
# The host's agent is alive but the engine it forwarded to stopped answering (grid.infer.client
# EngineStalled): retryable, and the host refuses that engine new requests until it answers again.
CODE_ENGINE_STALLED = "engine_stalled"
CODE_NOT_FOUND = "not_found"
CODE_METHOD_NOT_ALLOWED = "method_not_allowed"
CODE_INTERNAL = "internal_error"
CODE_CANNOT_BE_PLACED = "model_cannot_be_placed"
CODE_EMBEDDINGS_NOT_SUPPORTED = "model_does_not_support_embeddings"
# OpenAI's own code for a request that cannot fit the model's context window.
CODE_CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
CODE_UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
# An engine's own refusal, rewritten to the OpenAI shape (its numeric code becomes one of these).
CODE_UPSTREAM_REJECTED = "upstream_rejected"
UPSTREAM_CODES = {400: "invalid_request", 404: "not_found", 413: "request_too_large", 501: "unsupported_endpoint"}
MAX_UPSTREAM_MESSAGE = 500


class ErrorDetail(msgspec.Struct, frozen=True):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(msgspec.Struct, frozen=True):
    error: ErrorDetail


_encoder = msgspec.json.Encoder()


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    return _encoder.encode(ErrorBody(ErrorDetail(message, type_, param, code)))


def error_response(
    status: int,
    message: str,
    type_: str,
    code: str | None,
    *,
    param: str | None = None,
    retry_after: float | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    out = dict(headers or {})
    if retry_after is not None:
        out["Retry-After"] = str(max(1, int(math.ceil(retry_after))))
    return Response(error_body(message, type_, code, param), status_code=status, headers=out,
                    media_type="application/json")


def bad_request(message: str, code: str = CODE_INVALID_BODY, param: str | None = None) -> Response:
    return error_response(400, message, INVALID_REQUEST, code, param=param)


def unauthorized() -> Response:
    return error_response(
        401, "Missing or invalid API key. Pass it as 'Authorization: Bearer <key>'.",
        INVALID_REQUEST, CODE_INVALID_API_KEY, headers={"WWW-Authenticate": "Bearer"},
    )


def evaluation_not_allowed() -> Response:
    return error_response(
        403, "Only the grid's owner may mark a request as an evaluation: X-Grid-Evaluation-Token must be the "
             "operator token. Send the request without that header to have it served and counted as demand.",
        PERMISSION, CODE_EVALUATION_NOT_ALLOWED,
    )


def _shown(model: str) -> str:
    return model if len(model) <= 64 and model.isprintable() else "(invalid id)"


def embeddings_not_supported(model: str) -> Response:
    return error_response(
        400, f"The model '{_shown(model)}' does not serve embeddings (its profile sets embeddings: false).",
        INVALID_REQUEST, CODE_EMBEDDINGS_NOT_SUPPORTED, param="model",
    )


def context_length_exceeded(model: str, param: str, context_tokens: int) -> Response:
    return error_response(
        400, f"'{param}' exceeds the context window of '{_shown(model)}' ({context_tokens} tokens): the "
        f"answer could never be that long. Ask for at most {context_tokens} tokens, prompt included.",
        INVALID_REQUEST, CODE_CONTEXT_LENGTH_EXCEEDED, param=param,
    )


def unsupported_media_type(message: str) -> Response:
    # The body was not read: close, so its bytes are never parsed as the next request.
    return error_response(415, message, INVALID_REQUEST, CODE_UNSUPPORTED_MEDIA_TYPE,
                          headers={"Connection": "close"})


def from_upstream(status: int, error: dict[str, object]) -> Response:
    """An engine's refusal in the OpenAI shape: string `code`, `param`, `type`, bounded message.

    llama-server answers {"code": 400, "message", "type"}: a numeric code and no param, which
    the official clients then mis-read.
    """
    message = error.get("message")
    type_ = error.get("type")
    param = error.get("param")
    code = error.get("code")
    return error_response(
        status,
        message[:MAX_UPSTREAM_MESSAGE] if isinstance(message, str) and message else
        f"The engine rejected the request (HTTP {status}).",
        type_ if isinstance(type_, str) and type_ else INVALID_REQUEST,
        code if isinstance(code, str) and code else UPSTREAM_CODES.get(status, CODE_UPSTREAM_REJECTED),
        param=param if isinstance(param, str) and param else None,
    )


def cannot_be_placed(model: str, reason: str, detail: str) -> Response:
    """503 without Retry-After: the reason (a planner REASON constant) is in the message."""
    message = f"The model '{_shown(model)}' cannot be placed on this grid: {reason}"
    return error_response(503, message + (f" ({detail})." if detail else "."), UNAVAILABLE, CODE_CANNOT_BE_PLACED,
                          headers={REASON_HEADER: reason})


def model_not_found(model: str) -> Response:
    return error_response(
        404, f"The model '{_shown(model)}' does not exist or is not served by this grid.",
        INVALID_REQUEST, CODE_MODEL_NOT_FOUND, param="model",
    )
