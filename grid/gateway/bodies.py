"""Typed views of OpenAI request bodies: only the fields the gateway needs, strictly typed.

Unknown fields are skipped (the raw body goes upstream unchanged). Malformed JSON, wrong
types, a non-object body and pathological nesting all become a `BodyError` (-> 400), never an
exception escaping to a 500. Text is extracted only for the classifier and dropped with the
request; nothing here is retained.
"""

from __future__ import annotations

from typing import Union

import msgspec

from grid.demand.workload import CHARS_PER_UNIT, SCAN_CHARS
from grid.gateway.errors import CODE_OUT_OF_RANGE

MAX_MODEL_ID_CHARS = 256
# The most tokens one request may ask for: above any context window the fleet runs. An engine
# reads max_tokens=-1 as "until the context is full", so such values never go upstream.
MAX_TOKENS_LIMIT = 131_072

# Inclusive bounds of the sampling parameters checked before a request reaches an engine
# (OpenAI's documented ranges; top_k and min_p are llama.cpp's). Out of range is a 400.
SAMPLING_BOUNDS: dict[str, tuple[float, float]] = {
    "max_tokens": (1, MAX_TOKENS_LIMIT),
    "max_completion_tokens": (1, MAX_TOKENS_LIMIT),
    "n": (1, 128),
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "top_k": (0, 1000),
    "min_p": (0.0, 1.0),
}


# The chat roles OpenAI's API defines ("function" is its deprecated predecessor of "tool"). An
# engine given another role either fails the request after routing (a breaker's worth of 400s)
# or renders it into the prompt template as if it were one; refused here, before any routing.
CHAT_ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool", "developer", "function")
_CHAT_ROLES = frozenset(CHAT_ROLES)

# Media types a request body may declare: JSON (application/json, or a structured syntax suffix
# such as application/vnd.x+json, RFC 6839), with any parameters (charset). A request with no
# Content-Type is read as JSON, as engines and OpenAI's SDKs do; any other type (text/plain, a
# form) is refused with 415 before its body is read, since it says the bytes are not JSON.
JSON_MEDIA_TYPE = "application/json"
JSON_SUFFIX = "+json"
MAX_CONTENT_TYPE_CHARS = 256


def content_type_error(value: bytes | None) -> str | None:
    """Why a request declaring Content-Type `value` cannot carry a JSON body, or None."""
    if value is None:
        return None
    try:
        media = value.decode("ascii").split(";", 1)[0].strip().lower() if len(value) <= MAX_CONTENT_TYPE_CHARS \
            else ""
    except UnicodeDecodeError:
        media = ""
    if media == JSON_MEDIA_TYPE or (media.startswith("application/") and media.endswith(JSON_SUFFIX)):
        return None
    return (f"Unsupported Content-Type: request bodies are JSON; send 'Content-Type: {JSON_MEDIA_TYPE}' "
            "(or an application/*+json type).")


class _Part(msgspec.Struct):
    type: str = "text"
    text: str | None = None


class _Message(msgspec.Struct):
    role: str = "user"
    content: str | list[_Part] | None = None


class ChatBody(msgspec.Struct):
    model: str
    messages: list[_Message]
    stream: bool | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    min_p: float | None = None


_PromptItem = Union[str, int, list[int]]


class CompletionBody(msgspec.Struct):
    model: str
    prompt: str | list[_PromptItem] | None = None
    stream: bool | None = None
    max_tokens: int | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    min_p: float | None = None


class EmbeddingBody(msgspec.Struct):
    model: str
    input: str | list[_PromptItem]


BODY_TYPES: dict[str, type] = {"chat": ChatBody, "completions": CompletionBody, "embeddings": EmbeddingBody}
_DECODERS = {k: msgspec.json.Decoder(t) for k, t in BODY_TYPES.items()}


class BodyError(msgspec.Struct, frozen=True):
    message: str
    param: str | None = None
    code: str = "invalid_request_body"


class Parsed(msgspec.Struct, frozen=True):
    model: str
    stream: bool
    max_tokens: int | None
    text_head: str  # at most SCAN_CHARS characters, for the classifier only
    input_units: int
    # The body field max_tokens came from (max_completion_tokens wins when both are given).
    max_tokens_param: str = "max_tokens"


def _text_units(pieces: list[str]) -> tuple[str, int]:
    total = 0
    head: list[str] = []
    head_len = 0
    for p in pieces:
        total += len(p)
        if head_len < SCAN_CHARS:
            take = p[: SCAN_CHARS - head_len]
            head.append(take)
            head_len += len(take) + 1
    units = (total + CHARS_PER_UNIT - 1) // CHARS_PER_UNIT if total else 0
    return "\n".join(head)[:SCAN_CHARS], units


def parse(kind: str, body: bytes) -> Parsed | BodyError:
    try:
        value = _DECODERS[kind].decode(body)
    except msgspec.ValidationError as exc:
        return BodyError(f"Invalid request body: {_short(exc)}")
    except msgspec.DecodeError:
        return BodyError("Request body is not valid JSON.", code="invalid_json")
    except RecursionError:
        return BodyError("Request body is nested too deeply.", code="invalid_json")
    model = value.model
    if not model or len(model) > MAX_MODEL_ID_CHARS or not model.isprintable():
        return BodyError("'model' must be a printable model id of at most 256 characters.", param="model")
    pieces: list[str] = []
    stream = False
    max_tokens: int | None = None
    max_tokens_param = "max_tokens"
    if isinstance(value, ChatBody):
        if not value.messages:
            return BodyError("'messages' must be a non-empty array.", param="messages")
        for i, m in enumerate(value.messages):
            if m.role not in _CHAT_ROLES:
                # Names the place, never the value (a hostile body is not reflected back).
                return BodyError(f"Invalid 'messages[{i}].role': expected one of {', '.join(CHAT_ROLES)}.",
                                 param=f"messages[{i}].role")
            c = m.content
            if isinstance(c, str):
                pieces.append(c)
            elif c:
                pieces.extend(p.text for p in c if p.text)
        stream = bool(value.stream)
        if value.max_completion_tokens is not None:
            max_tokens, max_tokens_param = value.max_completion_tokens, "max_completion_tokens"
        else:
            max_tokens = value.max_tokens
    elif isinstance(value, CompletionBody):
        p = value.prompt
        if isinstance(p, str):
            pieces.append(p)
        elif p:
            pieces.extend(x for x in p if isinstance(x, str))
        stream = bool(value.stream)
        max_tokens = value.max_tokens
    else:
        i = value.input
        if isinstance(i, str):
            pieces.append(i)
        else:
            pieces.extend(x for x in i if isinstance(x, str))
    if not isinstance(value, EmbeddingBody):
        out_of_range = _check_sampling(value)
        if out_of_range is not None:
            return out_of_range
    head, units = _text_units(pieces)
    return Parsed(model=model, stream=stream, max_tokens=max_tokens, text_head=head, input_units=units,
                  max_tokens_param=max_tokens_param)


def _check_sampling(value: ChatBody | CompletionBody) -> BodyError | None:
    for name, (low, high) in SAMPLING_BOUNDS.items():
        v = getattr(value, name, None)
        if v is not None and not (low <= v <= high):  # NaN fails this too
            return BodyError(f"Invalid '{name}': expected a value from {low:g} to {high:g}.", param=name,
                             code=CODE_OUT_OF_RANGE)
    return None


def _short(exc: Exception) -> str:
    # msgspec messages name the field path and expected type, never the offending value.
    return str(exc)[:200]


class _ModelOnly(msgspec.Struct):
    model: str


def replace_model(body: bytes, model: str) -> bytes:
    """The same body with "model" replaced (used only for model "auto")."""
    fields = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    fields["model"] = msgspec.Raw(msgspec.json.encode(model))
    return msgspec.json.encode(fields)
