"""Framing of one inference exchange over core NATS.

Request: one message on `grid.infer.<host>.req` with a unique reply inbox; headers name the
engine path and the model; the body is the client's request body, unchanged.

Response: messages on the reply inbox, numbered from 0 by `Grid-Seq` so a loss (core NATS
drops messages for a slow consumer) is detected rather than silently corrupting a stream.
Message 0 carries `Grid-Status` and the engine's response headers (JSON in `Grid-Headers`):
with the first body bytes (a small answer arrives whole, ended, in message 0), or, for an event
stream, alone, as soon as the engine sent its head; every message may carry body bytes; the
last carries `Grid-End`, and `Grid-Error` if the engine failed part way (or stalled:
`ERR_ENGINE_STALLED`). The gateway cancels by publishing the reply inbox on
`grid.infer.<host>.cancel`; the agent then closes its engine connection, which frees the slot.
"""

from __future__ import annotations

import msgspec

H_PATH = "Grid-Path"
H_MODEL = "Grid-Model"
H_ACCEPT = "Accept"
H_CONTENT_TYPE = "Content-Type"
# Only "close" is carried: llama-server closes a connection after a streamed answer without
# saying so, so the gateway asks for a fresh engine connection per stream (grid.gateway.routes),
# and a later POST never lands on a dead pooled connection (it could not be replayed).
H_CONNECTION = "Connection"
H_SEQ = "Grid-Seq"
H_STATUS = "Grid-Status"
H_HEADERS = "Grid-Headers"
H_END = "Grid-End"
H_ERROR = "Grid-Error"
# "The engine is working on it": sent (no Grid-Seq, no body) when the engine has not answered
# within WORKING_AFTER_SECONDS, so a long non-streamed answer (the engine sends its status only
# when it is done) is not taken for an absent agent by the gateway's connect timeout. After it
# the gateway waits for message 0 with its read timeout. Never sent after message 0.
H_WORKING = "Grid-Working"
WORKING_AFTER_SECONDS = 1.0
# Progress markers: a requester that sends `Grid-Progress: 1` understands `Grid-Working` markers at
# any point of an answer, so the agent sends one for every PROGRESS_SWEEP_SECONDS in which the
# answer sent nothing (the engine still working on a long non-streamed answer, or between two
# distant chunks). The agent's message 0 and markers then carry `Grid-Progress: <max gap>`, the
# longest the requester can see nothing while the agent is alive: the requester bounds silence by
# that evidence instead of its read timeout, so an answer whose host died, was cut off or stopped
# ends within seconds. Requesters that do not ask get the single marker before message 0 only
# (an older gateway reads any other message without Grid-Seq as a lost part of the answer).
H_PROGRESS = "Grid-Progress"
PROGRESS_SWEEP_SECONDS = 1.0
# A marker is sent at the first sweep that finds an answer silent since the sweep before, so the
# longest gap between two messages of a live answer is two sweeps.
PROGRESS_MAX_GAP_SECONDS = 2 * PROGRESS_SWEEP_SECONDS
# Where a failure happened: "connect" means nothing reached the engine (another replica may be
# tried); "read" means the request may have been executed (it is never sent elsewhere).
H_PHASE = "Grid-Phase"
PHASE_CONNECT = "connect"
PHASE_READ = "read"

# Paths an agent forwards; anything else is refused before it reaches an engine.
ALLOWED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
# Request headers carried to the engine (content negotiation and "Connection: close" only;
# never Authorization).
FORWARDED_REQUEST_HEADERS = (H_CONTENT_TYPE, H_ACCEPT, H_CONNECTION)
# Response bodies are cut into messages of at most this many bytes: with their headers, under
# the largest message a host may publish at all (grid.identity.permissions.HOST_MAX_PAYLOAD),
# which is kept just over a host event's size so that the server refuses anything bigger
# before the grid's ingress has to read it.
CHUNK_BYTES = 56 * 1024

# Refusals before the engine (a status the gateway passes on, never a transport error).
ERR_NO_ENGINE = "no_engine_for_model"
# Set on a refusal answered before any engine saw the request (its value is the refusal's code):
# proof, like NATS's "no responders", that sending the request elsewhere replays nothing.
H_REFUSED = "Grid-Refused"
ERR_PATH = "path_not_allowed"
# The `Grid-Error` of an answer the agent stopped because its own NATS connection was lost. The
# gateway reports it exactly as it reports losing its own connection (`upstream_connection_lost`):
# which of the two notices first is a race, and the client must see the same error either way.
ERR_CONNECTION_LOST = "the agent lost its NATS connection"
# The `Grid-Error` of an answer the agent ended because its engine stalled: the engine sent it
# nothing for a while and then left several health checks in a row unanswered (a stopped, wedged
# or dead process; grid.infer.responder.stall_verdict). The agent itself is alive, so the gateway
# reports it as the engine's failure (`engine_stalled`, retryable), never as a silent host. The
# request may have executed: it is never sent elsewhere.
ERR_ENGINE_STALLED = "engine_stalled"

_headers_encoder = msgspec.json.Encoder()
_headers_decoder = msgspec.json.Decoder(list[tuple[str, str]])


def encode_headers(headers: list[tuple[bytes, bytes]]) -> str:
    return _headers_encoder.encode([(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]).decode()


def decode_headers(value: str) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in _headers_decoder.decode(value)]
