"""Prometheus metrics for the gateway, the controller and the agent (`/metrics` on each).

Each process owns one registry (never the global default: `gridctl up` runs every component
in one process, and a test runs many). Counters and histograms are updated where the event
happens; everything that is a state (routes by state, residencies, plan age, lease term) is
read from the component's own snapshot at scrape time, so it can never drift from what the
component believes.

Labels are bounded: model ids come from configured profiles (the gateway refuses unknown
models before they reach a metric), host ids from signed heartbeats (the gateway's request
series carry the host that served the request; "" when none did, say a 503 before routing),
statuses are HTTP codes, states are the fixed
vocabularies in grid.events.host, rejection reasons the constants of grid.identity.signing and
grid.identity.provenance. No label ever carries a prompt, a key or a user.

One family has the same name in every process: `grid_events_rejected_total{reason}`, the log
messages this process refused as not provably their author's (a counter, read at scrape time
from the process's own authorship gate; it starts again from zero when the process does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from grid.events.authorship import HEARTBEAT_REJECTION_REASONS
from grid.events.requests import RequestFeatures
from grid.identity.provenance import SUBJECT_MISMATCH
from grid.identity.signing import REJECTION_REASONS

# Latency buckets (seconds) for requests on small local models up to long generations.
REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# Tick and action durations: a tick is milliseconds; a load can be minutes.
TICK_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
ACTION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)

Sample = tuple[tuple[str, ...], float]


@dataclass(frozen=True)
class GaugeSource:
    """A gauge family read at scrape time: `read()` returns (label values, value) pairs."""

    name: str
    documentation: str
    labels: tuple[str, ...]
    read: Callable[[], Iterable[Sample]]


@dataclass(frozen=True)
class CounterSource:
    """A counter family read at scrape time from a count the component keeps (never lowered while
    it runs): `read()` returns (label values, value) pairs; `name` is without `_total`."""

    name: str
    documentation: str
    labels: tuple[str, ...]
    read: Callable[[], Iterable[Sample]]


Source = GaugeSource | CounterSource


def _family(s: Source) -> GaugeMetricFamily | CounterMetricFamily:
    kind = CounterMetricFamily if isinstance(s, CounterSource) else GaugeMetricFamily
    return kind(s.name, s.documentation, labels=list(s.labels))


class GaugeCollector:
    """Turns GaugeSources and CounterSources into metric families on every scrape."""

    def __init__(self, sources: Iterable[Source]) -> None:
        self.sources = tuple(sources)

    def describe(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        # Describing without reading keeps registration free of side effects.
        return [_family(s) for s in self.sources]

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        for s in self.sources:
            family = _family(s)
            for labels, value in s.read():
                family.add_metric(list(labels), float(value))
            yield family


def counts(values: Iterable[str], vocabulary: Iterable[str] = ()) -> list[Sample]:
    """(state,) -> count, with every state of `vocabulary` present (zero included) and sorted."""
    tally: dict[str, int] = {v: 0 for v in vocabulary}
    for v in values:
        tally[v] = tally.get(v, 0) + 1
    return [((k,), float(n)) for k, n in sorted(tally.items())]


# Every reason a reader refuses a log message for (each present in the family, zero included).
REJECTION_VOCABULARY: tuple[str, ...] = (*REJECTION_REASONS, SUBJECT_MISMATCH, *HEARTBEAT_REJECTION_REASONS)
REJECTED_EVENTS = "grid_events_rejected"


def rejected_events(read: Callable[[], Mapping[str, int]]) -> CounterSource:
    """`grid_events_rejected_total{reason}` of one process, from its rejection counts by reason."""

    def samples() -> list[Sample]:
        tally = {reason: 0 for reason in REJECTION_VOCABULARY}
        tally.update(read())
        return [((reason,), float(n)) for reason, n in sorted(tally.items())]

    return CounterSource(REJECTED_EVENTS,
                         "Log messages this process refused as not provably written by an identity that may write "
                         "their subject (unsigned, forged, revoked or expired signer, not permitted, or not vouched "
                         "for by their subject), or heartbeats replayed or signed outside the allowed clock skew "
                         "(stale_replay, signed_ahead), by reason: skipped, never folded or executed.",
                         ("reason",), samples)


class GatewayMetrics:
    def __init__(self, sources: Iterable[Source] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("grid_gateway_requests",
                                "Requests answered, by served model, endpoint, HTTP status and serving host.",
                                ["model", "endpoint", "status", "host"], registry=r)
        self.latency = Histogram("grid_gateway_request_seconds",
                                 "Time from request to last byte, by served model and serving host.",
                                 ["model", "endpoint", "host"], buckets=REQUEST_BUCKETS, registry=r)
        self.ttft = Histogram("grid_gateway_time_to_first_token_seconds",
                              "Time from request to the first streamed chunk, by served model and serving host.",
                              ["model", "host"], buckets=REQUEST_BUCKETS, registry=r)
        self.tokens = Counter("grid_gateway_tokens",
                              "Approximate input and output units, by served model and serving host.",
                              ["model", "direction", "host"], registry=r)
        self.telemetry_dropped = Counter("grid_gateway_telemetry_dropped",
                                         "Request records dropped because the telemetry queue was full.", registry=r)
        r.register(GaugeCollector(sources))

    def record_request(self, features: RequestFeatures, *, ttft_seconds: float | None = None) -> None:
        model = features.served_model or features.requested_model
        host = features.host_id or ""
        status = str(features.status_code)
        self.requests.labels(model, features.endpoint, status, host).inc()
        self.latency.labels(model, features.endpoint, host).observe(
            max(0.0, features.service_seconds + features.queue_seconds))
        if ttft_seconds is not None:
            self.ttft.labels(model, host).observe(max(0.0, ttft_seconds))
        if features.input_units:
            self.tokens.labels(model, "input", host).inc(features.input_units)
        if features.output_units:
            self.tokens.labels(model, "output", host).inc(features.output_units)


class ControllerMetrics:
    def __init__(self, sources: Iterable[Source] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.tick = Histogram("grid_controller_tick_seconds", "Duration of one reconciliation pass (plan + commands).",
                              buckets=TICK_BUCKETS, registry=self.registry)
        self.commands = Counter("grid_controller_commands_issued", "Commands issued, by kind.", ["kind"],
                                registry=self.registry)
        self.registry.register(GaugeCollector(sources))


class AgentMetrics:
    def __init__(self, sources: Iterable[Source] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.actions = Histogram("grid_agent_action_seconds", "Duration of lifecycle actions, by kind and outcome.",
                                 ["kind", "status"], buckets=ACTION_BUCKETS, registry=self.registry)
        self.registry.register(GaugeCollector(sources))


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def metrics_route(registry: CollectorRegistry, *, path: str = "/metrics") -> Route:
    async def metrics(_request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Route(path, metrics, methods=["GET"])
