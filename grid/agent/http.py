"""The agent's small loopback HTTP listener: `/metrics` (Prometheus) and `/health`.

The agent otherwise talks only through the event log; this listener exists so a local
Prometheus (or an operator with curl) can read residency states, protection state and action
durations. It binds loopback only (it carries no credential check, and nothing on it can change
anything), on `AgentOptions.http_port` (0: a free port, as the engines' ports are chosen by
the OS when no range is given). The URL it serves is written owner-only to METRICS_URL_FILE in
the agent's state directory, where `gridctl node status` finds it, and removed on stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from grid.agent.protection import ProtectionStatus
from grid.agent.state import AgentState
from grid.events.host import HOST_STATES, RESIDENCY_STATES
from grid.http_limits import ListenerLimits, uvicorn_options
from grid.infer.responder import InferenceResponder
from grid.metrics import AgentMetrics, CounterSource, GaugeSource, Sample, counts, metrics_route, rejected_events
from grid.secrets import write_owner_only
from grid.tasks import cancel_and_wait

log = structlog.get_logger("grid.agent")

METRICS_URL_FILE = "metrics.url"
LOOPBACK = "127.0.0.1"


# Why the responder refused a request without an answer from an engine, beside grid.identity.replies'.
REFUSED_ENGINE_STALLED = "engine_stalled"


def responder_metrics(responder: Callable[[], InferenceResponder | None]) -> list[CounterSource]:
    """The inference responder's counts (grid.infer.responder), zero before it starts: how many
    requests it served, how its engines' health checks went while answers waited in silence, how
    many answers it ended because their engine stalled, and what it refused, by reason."""

    def of(read: Callable[[InferenceResponder], list[Sample]]) -> Callable[[], list[Sample]]:
        def samples() -> list[Sample]:
            r = responder()
            return [] if r is None else read(r)
        return samples

    return [
        CounterSource("grid_agent_inference_served", "Inference requests this agent took to an engine.", (),
                      of(lambda r: [((), float(r.served))])),
        CounterSource("grid_agent_engine_health_checks",
                      "Health checks of an engine an answer was waiting on in silence, by whether it answered.",
                      ("result",), of(lambda r: [(("answered",), float(r.health_probes - r.health_probes_unanswered)),
                                                 (("unanswered",), float(r.health_probes_unanswered))])),
        CounterSource("grid_agent_inference_stalled",
                      "Answers ended because their engine stalled (silent, its health checks unanswered).", (),
                      of(lambda r: [((), float(r.stalled_answers))])),
        CounterSource("grid_agent_inference_refused",
                      "Inference requests refused before any engine saw them, by reason.", ("reason",),
                      of(lambda r: [((reason,), float(n)) for reason, n in
                                    sorted({**r.refused, REFUSED_ENGINE_STALLED: r.refused_stalled}.items())])),
    ]


def agent_metrics(state: Callable[[], AgentState], protection: Callable[[], ProtectionStatus],
                  rejected: Callable[[], Mapping[str, int]] = dict,
                  responder: Callable[[], InferenceResponder | None] = lambda: None) -> AgentMetrics:
    """The agent's registry: states read from its live state at scrape time; `rejected` counts
    the messages on its command queue no controller of its grid provably wrote, by reason;
    `responder` is its inference responder, once started."""

    def residencies() -> list[Sample]:
        return counts((r.state for r in state().residencies.values()), RESIDENCY_STATES)

    def protection_state() -> list[Sample]:
        # One-hot over the fixed vocabulary: alert rules can match state="quarantined" == 1.
        current = protection().state
        return [((s,), 1.0 if s == current else 0.0) for s in HOST_STATES]

    def in_flight() -> list[Sample]:
        return [((), 0.0 if state().in_flight is None else 1.0)]

    return AgentMetrics([
        GaugeSource("grid_agent_residencies", "Residencies on this host, by lifecycle state.", ("state",), residencies),
        GaugeSource("grid_agent_protection_state", "This host's effective protection state (1 = current).",
                    ("state",), protection_state),
        GaugeSource("grid_agent_action_in_flight", "Whether a lifecycle action is executing now.", (), in_flight),
        rejected_events(rejected),
        *responder_metrics(responder),
    ])


class _Server(uvicorn.Server):
    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()  # the agent's process owns signal handling


class AgentHttp:
    def __init__(self, metrics: AgentMetrics, state_dir: Path, limits: ListenerLimits | None = None) -> None:
        self.metrics = metrics
        self.limits = limits  # connection limits (grid.http_limits); None: from the environment
        self.url_file = Path(state_dir) / METRICS_URL_FILE
        self.url: str | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    def app(self) -> Starlette:
        async def health(_request: Request) -> JSONResponse:
            return JSONResponse({"status": "ok"})

        return Starlette(routes=[metrics_route(self.metrics.registry), Route("/health", health, methods=["GET"])])

    async def start(self, port: int = 0) -> str:
        # Bind here: uvicorn answers a bind failure with sys.exit, which asyncio re-raises out of
        # the event loop (it would stop the whole agent, or `gridctl up`). An OSError is ours.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((LOOPBACK, port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        config = uvicorn.Config(self.app(), lifespan="off", log_level="warning",
                                access_log=False, log_config=None, server_header=False, date_header=False,
                                **uvicorn_options(self.limits))
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="agent-http")
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("agent HTTP listener exited during startup")
            await asyncio.sleep(0.01)
        bound = port
        for srv in self._server.servers:
            for sock in srv.sockets:
                bound = int(sock.getsockname()[1])
        self.url = f"http://{LOOPBACK}:{bound}"
        write_owner_only(self.url_file, (self.url + "\n").encode())
        return self.url

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 5.0)
        except TimeoutError:
            self._server.force_exit = True
            await cancel_and_wait([self._task])
        with contextlib.suppress(OSError):
            if self.url_file.read_text().strip() == self.url:
                self.url_file.unlink()
        self._server = self._task = None


async def start_listener(metrics: AgentMetrics, state_dir: Path, port: int | None,
                         warn: Callable[[str], None]) -> AgentHttp | None:
    """Start the listener (port None: none). A failure is a warning: metrics are optional, serving is not."""
    if port is None:
        return None
    http = AgentHttp(metrics, state_dir)
    try:
        await http.start(port)
    except (OSError, RuntimeError) as exc:
        warn(f"metrics_listener_failed: {type(exc).__name__}")
        return None
    return http


def read_metrics_url(state_dir: Path) -> str | None:
    try:
        return (Path(state_dir) / METRICS_URL_FILE).read_text().strip() or None
    except OSError:
        return None
