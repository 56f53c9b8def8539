"""What each failure of a forwarded request means, in one table.

A request is forwarded in stages: it is sent (`SENDING`, until the answer's head arrives), then a
plain answer's body is read (`READING`; a stream is relayed by grid.gateway.responses.ProxyStream
and ends with one of its outcomes, `STREAM_ENDINGS` below). `FAILURES` maps what a stage raises to
everything the gateway does about it: the route's circuit-breaker outcome, the telemetry outcome,
the HTTP status (the client's answer and the telemetry record), the error code, and whether the
request is routed again. Rows are matched in order, first match wins, like `except` clauses:
SilentBeforeAnswer is also an httpx.ConnectTimeout, NoResponders and NotServedThere are httpx
ConnectErrors, UpstreamConnectionLost and EngineStalled are httpx ReadErrors.

Why each row is what it is:

* NoResponders: nobody subscribes to the host's inference subject, so its agent is gone and the
  request reached no one. Not an engine failure (the breaker stays as it was): the host is
  unroutable until it heartbeats again, and the request may go to another replica. When no
  routing is left, 503 model_not_ready: no replica could take it just now.
* NotServedThere: the agent has no ready engine for the model (its copy is draining, or this
  gateway's view is a heartbeat behind): refused before any engine saw it, so another replica
  may take it. Not a failure of the route (the breaker stays as it was, the host stays routable),
  but this request never goes to that route again.
* UpstreamConnectionLost: the gateway's own NATS connection broke (a server restart): not the
  engine's fault, so the breaker stays as it was. The request may have been delivered: never
  sent anywhere else. The client may retry it.
* SilentHost: the host's agent went silent on the request: a failure of its route, and the host
  gets no new request until it heartbeats again, so the client's retry goes to another replica
  (or waits for one). Delivered, so never sent elsewhere.
* EngineStalled: delivered, so never sent elsewhere (the gateway only routes again what provably
  reached no engine); a failure of this route, and 504 like a silent host (the engine did not
  answer in time, by the agent's evidence). The host refuses that engine new requests until it
  answers again, so the client's retry goes to another replica.
* A timeout while sending: the engine did not answer in time, a failure of the route.
* Any other transport error, a bad URL, an OSError or a ValueError while sending: the engine
  could not be reached, a failure of the route.
* Anything else while sending (above all the request's task being cancelled): neutral for the
  breaker (it only frees a half-open probe), recorded as cancelled (499), and the exception
  propagates: there is no answer to give.
* While reading a plain answer the breaker has already recorded the answer's status, and the
  rows add to it: a lost NATS connection is again neutral, a silent host and a stalled engine
  are again failures; any other httpx error (a timeout too) means the connection broke during
  the response, a failure; anything else propagates, recorded as cancelled, the breaker left
  with the status.

A stream's head has gone to the client before the stream can fail, so a failed stream has no
answer to give: `STREAM_ENDINGS` holds what its record and the route's breaker learn, by the
outcome ProxyStream reports (a 502 in the record, a 499 when the client left).
"""

from __future__ import annotations

import httpx
import msgspec
from starlette.responses import Response

from grid.events.requests import Outcome
from grid.gateway import errors
from grid.gateway.breaker import OUTCOME_FAILURE, OUTCOME_NEUTRAL
from grid.gateway.responses import (
    STREAM_CLIENT_GONE,
    STREAM_CONNECTION_LOST,
    STREAM_ENGINE_STALLED,
    STREAM_UPSTREAM_BROKEN,
    STREAM_UPSTREAM_SILENT,
    STREAM_UPSTREAM_TIMEOUT,
)
from grid.gateway.routing import EXCLUDED_NO_RESPONDERS, EXCLUDED_SILENT
from grid.infer.client import EngineStalled, NoResponders, NotServedThere, SilentHost, UpstreamConnectionLost

SENDING = "sending"
READING = "reading"

# Gateway counters of requests routed again, by what proved they reached no engine.
RETRIED_NO_RESPONDERS = "no_responders_retried"
RETRIED_NOT_SERVED_THERE = "not_served_there_retried"


class Failure(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the table: a failure caught in one stage of forwarding, and what it means."""

    stage: str
    caught: tuple[type[BaseException], ...]
    # What the route's circuit breaker records (an OUTCOME_* constant); None: nothing.
    breaker: str | None
    # The telemetry record's outcome, and the status it records (which the client's answer carries).
    outcome: Outcome
    status: int
    # The client's error code; None: no answer is given, the exception propagates.
    code: str | None
    error_type: str = errors.SERVER_ERROR
    # The client's message; "{model}" is replaced by the route's model id.
    message: str = ""
    # The client's Retry-After hint (seconds); None: no hint.
    retry_after: float | None = None
    # Why the host gets no new request until it heartbeats again (a routing EXCLUDED_* constant).
    excludes_host: str | None = None
    # The request provably reached no engine: while routings remain it goes to another route, and
    # this counter counts it (a RETRIED_* constant). None: it is answered here.
    reroute_counter: str | None = None
    # When routed again, this request never goes back to the same route (its host stays routable).
    refuses_route: bool = False

    @property
    def reroutable(self) -> bool:
        return self.reroute_counter is not None

    def response(self, model: str) -> Response:
        """The client's answer (for a row with a `code`), about a request for `model`."""
        return errors.error_response(self.status, self.message.format(model=model), self.error_type, self.code,
                                     retry_after=self.retry_after)


def _delivered(stage: str) -> tuple[Failure, ...]:
    """The failures that mean the same in both stages: the request was delivered (never routed
    again), and the gateway's connection, the host's agent or its engine failed it."""
    return (
        Failure(stage=stage, caught=(UpstreamConnectionLost,), breaker=OUTCOME_NEUTRAL, outcome="error", status=502,
                code=errors.CODE_UPSTREAM_CONNECTION_LOST, message=UpstreamConnectionLost.client_message,
                retry_after=1.0),
        Failure(stage=stage, caught=(SilentHost,), breaker=OUTCOME_FAILURE, outcome="timeout", status=504,
                code=errors.CODE_UPSTREAM_SILENT, message=SilentHost.client_message, retry_after=1.0,
                excludes_host=EXCLUDED_SILENT),
        Failure(stage=stage, caught=(EngineStalled,), breaker=OUTCOME_FAILURE, outcome="timeout", status=504,
                code=errors.CODE_ENGINE_STALLED, message=EngineStalled.client_message, retry_after=1.0),
    )


FAILURES: tuple[Failure, ...] = (
    # --- while sending: nothing of the answer has arrived --------------------------------------
    Failure(stage=SENDING, caught=(NoResponders,), breaker=OUTCOME_NEUTRAL, outcome="unavailable", status=503,
            code=errors.CODE_NO_READY_REPLICA, error_type=errors.UNAVAILABLE,
            message="The host serving this model went away; retry shortly.", retry_after=1.0,
            excludes_host=EXCLUDED_NO_RESPONDERS, reroute_counter=RETRIED_NO_RESPONDERS),
    Failure(stage=SENDING, caught=(NotServedThere,), breaker=OUTCOME_NEUTRAL, outcome="unavailable", status=503,
            code=errors.CODE_NO_READY_REPLICA, error_type=errors.UNAVAILABLE,
            message="No host could serve '{model}' just now; retry shortly.", retry_after=1.0,
            reroute_counter=RETRIED_NOT_SERVED_THERE, refuses_route=True),
    *_delivered(SENDING),
    Failure(stage=SENDING, caught=(httpx.TimeoutException,), breaker=OUTCOME_FAILURE, outcome="timeout", status=504,
            code=errors.CODE_UPSTREAM_TIMEOUT, message="The engine did not answer in time."),
    Failure(stage=SENDING, caught=(httpx.HTTPError, httpx.InvalidURL, OSError, ValueError), breaker=OUTCOME_FAILURE,
            outcome="error", status=502, code=errors.CODE_UPSTREAM_ERROR,
            message="The engine could not be reached."),
    Failure(stage=SENDING, caught=(BaseException,), breaker=OUTCOME_NEUTRAL, outcome="cancelled", status=499,
            code=None),
    # --- while reading a plain answer: the breaker has judged its status already --------------
    *_delivered(READING),
    Failure(stage=READING, caught=(httpx.HTTPError,), breaker=OUTCOME_FAILURE, outcome="error", status=502,
            code=errors.CODE_UPSTREAM_ERROR, message="The engine connection broke during the response."),
    Failure(stage=READING, caught=(BaseException,), breaker=None, outcome="cancelled", status=499, code=None),
)


def failure_of(stage: str, exc: BaseException) -> Failure:
    """The first row of `stage` that catches `exc` (each stage ends with a row for anything)."""
    for failure in FAILURES:
        if failure.stage == stage and isinstance(exc, failure.caught):
            return failure
    raise ValueError(f"no failure row for stage {stage!r}")


class StreamEnding(msgspec.Struct, frozen=True, kw_only=True):
    """How a relayed stream that did not finish is recorded, by its ProxyStream outcome."""

    breaker: str | None
    outcome: Outcome
    status: int
    excludes_host: str | None = None
    # Whether the record counts the completion tokens the stream had reported.
    counts_output: bool = False


STREAM_ENDINGS: dict[str, StreamEnding] = {
    # The client left: not the engine's doing.
    STREAM_CLIENT_GONE: StreamEnding(breaker=None, outcome="cancelled", status=499, counts_output=True),
    # The gateway's NATS connection: not the engine's fault.
    STREAM_CONNECTION_LOST: StreamEnding(breaker=None, outcome="error", status=502),
    STREAM_UPSTREAM_SILENT: StreamEnding(breaker=OUTCOME_FAILURE, outcome="timeout", status=502,
                                         excludes_host=EXCLUDED_SILENT),
    STREAM_ENGINE_STALLED: StreamEnding(breaker=OUTCOME_FAILURE, outcome="timeout", status=502, counts_output=True),
    STREAM_UPSTREAM_TIMEOUT: StreamEnding(breaker=OUTCOME_FAILURE, outcome="timeout", status=502),
    STREAM_UPSTREAM_BROKEN: StreamEnding(breaker=OUTCOME_FAILURE, outcome="error", status=502),
}


def stream_ending_of(outcome: str) -> StreamEnding:
    """A stream's failed ending; an outcome without its own row is a broken upstream."""
    return STREAM_ENDINGS.get(outcome, STREAM_ENDINGS[STREAM_UPSTREAM_BROKEN])
