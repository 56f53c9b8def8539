"""External routes are operator facts: an enrolled host's own engine draws nobody's prompts.

Real parts only: a nats-server in operator mode, every process on its own credential (host
agents, controller, gateway, the operator's gridctl), real host agents (grid.agent.service) that
probe and forward to tiny real HTTP servers standing in for engines Grid did not start, the real
controller with its admin API (`gridctl status --json`), and the real gateway app serving users'
chats over NATS to the agents.

- (a) a hostile enrolled host registers (`gridctl engine add`) its own engine for a model whose
  profile allows only another host: it gets no request, the honest host serves them all, its
  `engine add` only printed the operator's command, and status lists its claim as unadmitted;
- (b) a heartbeat claiming a `managed: false` ready residency nobody admitted draws no request,
  and is no supply (the plan places a managed replica instead, no ready replica counted) and so
  no proof of a replacement;
- (c) an engine the operator admitted (`gridctl engine admit`) on an allowed host is routed;
- (d) an admission for a host outside the profile's allowed hosts is refused by reason, and one
  that lands anyway routes nothing;
- (e) an admission authored by a host credential, landed on the control subject however (here
  through a connection that may write there, as a reflection would), is rejected by the fold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from grid.agent.sensors import FixedSensors
from grid.agent.service import AgentOptions, HostAgent
from grid.config import GridConfig
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet, RouteAdmitted
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.events.subjects import CONTROL_STREAM, host_subject, route_subject
from grid.gateway import routing
from grid.gateway import state as gateway_state
from grid.gateway.routes import build_routes, exception_handlers
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.permissions import Role
from grid.identity.provision import provision_host_consumer
from grid.identity.signing import BAD_SIGNATURE, NOT_PERMITTED, Identity
from grid.projections import routes
from grid.projections.runner import CORE_PROJECTIONS, ProjectionRunner
from grid.transport.jetstream import JetStreamLog
from tests.integration.controller.statuskit import serving_controller, status_until
from tests.integration.controller.test_cli_admin import gridctl
from tests.ports import engine_ports
from tests.security.conftest import CredsFactory, SecuredNats, raw_client

HONEST = "honest-host"
EVIL = "evil-host"
RESTRICTED = "restricted-model"
USERS = 10
KIND = "openai"


class _Engine(ThreadingHTTPServer):
    """A tiny real OpenAI-compatible server (Grid did not start it) that counts the chats it got."""

    daemon_threads = True

    def __init__(self, model: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.model = model
        self.chats = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Engine

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path.startswith("/v1/models"):
            self._send({"object": "list", "data": [{"id": self.server.model, "object": "model"}]})
        else:
            self._send({"status": "ok"})

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers.get("content-length") or 0))
        with self.server.lock:
            self.server.chats += 1
        self._send({"id": "x", "object": "chat.completion", "model": self.server.model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "OK"},
                                 "finish_reason": "stop"}]})


@contextlib.contextmanager
def engine(model: str = RESTRICTED) -> Any:
    server = _Engine(model)
    thread = threading.Thread(target=server.serve_forever, name=f"engine-{model}", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Grid:
    server: SecuredNats
    creds: CredsFactory
    authority: Authority
    controller_log: JetStreamLog
    operator_home: Path
    tmp: Path
    agents: dict[str, HostAgent] = field(default_factory=dict)
    gateway: gateway_state.Gateway | None = None
    http: httpx.AsyncClient | None = None
    controller_home: Path | None = None

    def home(self, host: str) -> Path:
        return self.tmp / f"{host}-home"

    async def start_agent(self, host: str) -> HostAgent:
        host_creds = self.creds(Role.HOST, host_id=host)
        await provision_host_consumer(self.controller_log, self.authority.host_principal(host))
        log = await connect_log(self.server.url, credentials=host_creds, name=f"grid-agent-{host}",
                                ensure_streams=False)
        agent = HostAgent(log, GridConfig(home=self.home(host), nats_url=None),
                          AgentOptions(host_id=host, credentials=host_creds, heartbeat_interval=0.3,
                                       sample_interval=0.1, port_range=engine_ports()),
                          sensor_source=FixedSensors())
        await agent.start()
        self.agents[host] = agent
        return agent

    async def engine_cmd(self, host: str, *args: str) -> tuple[int, str, str]:
        """`gridctl engine ...` on `host` (its grid home holds only its host credential)."""
        return await gridctl(self.home(host), "engine", *args, "--state-dir", str(self.home(host) / "agent"))

    async def operator(self, *args: str) -> tuple[int, str, str]:
        """`gridctl engine ...` on the operator's machine (its grid home holds the operator credential)."""
        return await gridctl(self.operator_home, "engine", *args, "--nats", self.server.url)

    async def start_gateway(self) -> None:
        log = await connect_log(self.server.url, name="grid-gateway", credentials=self.creds(Role.GATEWAY),
                                ensure_streams=False)
        self.gateway = gateway_state.Gateway(log, GridConfig(home=self.tmp / "gw", nats_url=None), api_keys=[])
        await self.gateway.start()
        app = Starlette(routes=build_routes(), exception_handlers=exception_handlers())
        app.state.gateway = self.gateway
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=30)

    def excluded(self, model: str = RESTRICTED) -> dict[str, str | None]:
        assert self.gateway is not None
        now = time.time()
        return {c.host_id: routing.exclusion(c, now) for c in self.gateway.table(now).get(model, ())}

    async def routed_when(self, check: Callable[[dict[str, str | None]], bool], model: str = RESTRICTED,
                          timeout: float = 20.0) -> dict[str, str | None]:
        deadline = time.monotonic() + timeout
        while True:
            table = self.excluded(model)
            if check(table):
                return table
            assert time.monotonic() < deadline, f"routing table never settled: {table}"
            await asyncio.sleep(0.2)

    async def chats(self, model: str = RESTRICTED) -> list[tuple[int, str | None]]:
        """One chat per user (each with its own affinity key), as the official clients send them."""
        assert self.http is not None
        out = []
        for i in range(USERS):
            r = await self.http.post("/v1/chat/completions", headers={"X-Grid-Affinity-Key": f"user-{i}"},
                                     json={"model": model, "max_tokens": 4,
                                           "messages": [{"role": "user", "content": "hi"}]})
            out.append((r.status_code, r.headers.get("x-grid-host")))
        return out


@pytest.fixture
async def grid(secured_server: SecuredNats, creds: CredsFactory, authority: Authority, controller_log: JetStreamLog,
               operator_home: Path, tmp_path: Path) -> AsyncIterator[Grid]:
    g = Grid(secured_server, creds, authority, controller_log, operator_home, tmp_path)
    try:
        yield g
    finally:
        if g.http is not None:
            await g.http.aclose()
        if g.gateway is not None:
            await g.gateway.stop()
            await g.gateway.log.close()
        for agent in g.agents.values():
            await agent.stop(drain=True)
            await agent.log.close()


async def restrict(log: JetStreamLog, model: str = RESTRICTED, **kw: Any) -> None:
    kw.setdefault("allow_hosts", (HONEST,))
    await log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=ModelProfile(
        model_id=model, memory_mb=300, min_replicas=1, **kw)))


async def register(g: Grid, host: str, url: str, model: str = RESTRICTED) -> str:
    """`gridctl engine add` on `host`: the registration, and the operator command it printed."""
    rc, out, err = await g.engine_cmd(host, "add", url, "--model", model, "--kind", KIND)
    assert rc == 0, err
    assert "takes no traffic until an operator admits it" in out, out
    command = next(line.strip() for line in out.splitlines() if line.strip().startswith("gridctl engine admit"))
    assert command == (f"gridctl engine admit {host} {model} --kind {KIND} --url-fingerprint "
                       f"{routes.url_fingerprint(url)}")
    return command


async def admit(g: Grid, command: str) -> tuple[int, str, str]:
    """The operator runs the command a host printed, on the operator's machine."""
    args = command.split()[2:]  # after "gridctl engine"
    return await g.operator(*args, "--json")


async def no_change(_: Any = None) -> None:
    return None


async def test_a_hostile_hosts_own_engine_for_a_restricted_model_gets_no_prompt(grid: Grid, tmp_path: Path) -> None:
    """(a) and (c): the honest host's admitted engine serves every user; the hostile host's
    registration, never admitted, serves nobody and shows in status as an unadmitted claim."""
    g = grid
    await restrict(g.controller_log)
    with engine() as honest_engine, engine() as evil_engine:
        for host in (HONEST, EVIL):
            await g.start_agent(host)
        before = await g.controller_log.last_sequence(CONTROL_STREAM)
        honest_request = await register(g, HONEST, honest_engine.url)
        await register(g, EVIL, evil_engine.url)
        # A host's `engine add` appended nothing: its credential may not write the control stream.
        assert await g.controller_log.last_sequence(CONTROL_STREAM) == before
        rc, out, err = await admit(g, honest_request)
        assert rc == 0, err + out
        assert json.loads(out)["admitted"] is True

        await g.start_gateway()
        table = await g.routed_when(lambda t: t.get(HONEST, "x") is None and EVIL in t)
        assert table == {HONEST: None, EVIL: routing.EXCLUDED_UNPLACED}
        answers = await g.chats()
        assert answers == [(200, HONEST)] * USERS
        assert (honest_engine.chats, evil_engine.chats) == (USERS, 0)

        home = tmp_path / "controller"
        async with serving_controller(g.controller_log, home, "ctl-routes"):
            doc = await status_until(home, no_change, lambda d: any(
                c["host_id"] == EVIL for c in d["unplaced_claims"]) and d["plan"] is not None, "the evil claim")
            claims = [(c["host_id"], c["model_id"], c["managed"], c["reason"]) for c in doc["unplaced_claims"]]
            assert claims == [(EVIL, RESTRICTED, False, routes.REASON_NOT_ADMITTED)]
            assert any(w.startswith(f"unadmitted external claim: host {EVIL} reports {RESTRICTED}")
                       for w in doc["warnings"]), doc["warnings"]
            placements = [(p["host_id"], p["status"], p["managed"]) for p in doc["plan"]["placements"]
                          if p["model_id"] == RESTRICTED]
            assert placements == [(HONEST, "existing", False)]  # the admitted engine is the supply
            rc, out, err = await gridctl(home, "status")
            assert rc == 0 and "(unadmitted claim)" in out, err + out
        rc, out, err = await g.operator("routes", "--json")
        assert rc == 0, err
        assert [(r["host_id"], r["model_id"]) for r in json.loads(out)["routes"]] == [(HONEST, RESTRICTED)]
    assert g.gateway is not None and g.gateway.runner.rejected == {}


async def test_an_unadmitted_unmanaged_heartbeat_claim_draws_nothing_and_is_no_supply(
        grid: Grid, tmp_path: Path) -> None:
    """(b): a host's heartbeat claims `managed: false, ready` for a model nobody placed or
    admitted there (no engine behind it at all)."""
    g = grid
    model = "open-model"
    await restrict(g.controller_log, model, allow_hosts=())
    claimer = await connect_log(g.server.url, name="grid-agent-claimer", ensure_streams=False,
                                credentials=g.creds(Role.HOST, host_id=EVIL))

    async def claim() -> None:
        residency = Residency(model_id=model, memory_mb=300, state="ready", managed=False, runtime=KIND,
                              endpoint="http://127.0.0.1:9", max_concurrency=8, loaded_age_seconds=3600.0)
        await claimer.append(HostHeartbeat(event_id=new_event_id(), at=time.time(), host_id=EVIL,
                                           resources=HostResources(capacity_mb=16000), residencies=(residency,)))

    try:
        await claim()
        await g.start_gateway()
        assert g.gateway is not None
        await claim()
        table = await g.routed_when(lambda t: EVIL in t, model)
        assert table == {EVIL: routing.EXCLUDED_UNPLACED}
        assert g.gateway.ready_models(time.time()) == []
        answers = await g.chats(model)
        assert all(status in (404, 503) and host is None for status, host in answers), answers
        assert not [r for r in g.gateway.stats()["routes"] if r["served"]]

        home = tmp_path / "controller"
        async with serving_controller(g.controller_log, home, "ctl-claims"):
            doc = await status_until(home, claim, lambda d: d["plan"] is not None and any(
                p["model_id"] == model for p in d["plan"]["placements"]) and d["unplaced_claims"], "a plan")
            assert [(c["host_id"], c["reason"]) for c in doc["unplaced_claims"]] == [(EVIL, routes.REASON_NOT_ADMITTED)]
            # No supply: the plan wants a managed replica of its own, not the claim kept as existing...
            mine = [(p["host_id"], p["status"], p["managed"]) for p in doc["plan"]["placements"]
                    if p["model_id"] == model]
            assert mine and all(managed and status == "new" for _, status, managed in mine), mine
            # ...and no ready replica is counted for it (so nothing could drain on its word).
            row = next(m for m in doc["models"] if m["model_id"] == model)
            assert row["ready"] == 0, row
    finally:
        await claimer.close()


async def test_an_admission_for_a_host_the_profile_does_not_allow_is_refused_by_reason(
        grid: Grid, tmp_path: Path) -> None:
    """(d): `gridctl engine admit` refuses it and appends nothing; an admission that lands anyway
    (the operator's own, appended before the profile was tightened) routes nothing either."""
    g = grid
    await restrict(g.controller_log)
    with engine() as evil_engine:
        await g.start_agent(EVIL)
        request = await register(g, EVIL, evil_engine.url)
        before = await g.controller_log.last_sequence(CONTROL_STREAM)
        rc, out, err = await admit(g, request)
        assert rc == 1, out
        refused = json.loads(out)
        assert (refused["admitted"], refused["reason"]) == (False, routes.REASON_HOST_NOT_ALLOWED)
        assert await g.controller_log.last_sequence(CONTROL_STREAM) == before
        rc, out, err = await g.operator("admit", EVIL, RESTRICTED, "--kind", KIND, "--url", evil_engine.url)
        assert rc == 1 and routes.REASON_HOST_NOT_ALLOWED in err, err

        operator = await connect_log(g.server.url, name="gridctl", ensure_streams=False,
                                     credentials=g.operator_home / "identity" / "creds" / "operator.creds")
        try:
            await operator.append(RouteAdmitted(event_id=new_event_id(), at=time.time(), host_id=EVIL,
                                                model_id=RESTRICTED, kind=KIND,
                                                url_fingerprint=routes.url_fingerprint(evil_engine.url)))
        finally:
            await operator.close()
        await g.start_gateway()
        table = await g.routed_when(lambda t: EVIL in t)
        assert table == {EVIL: routing.EXCLUDED_UNPLACED}
        assert g.gateway is not None
        reasons = [(c.host_id, c.managed, c.reason) for c in g.gateway.unplaced_claims(time.time())]
        assert reasons == [(EVIL, False, routes.REASON_HOST_NOT_ALLOWED)]
        answers = await g.chats()
        assert all(host is None for _, host in answers) and evil_engine.chats == 0
        assert g.gateway.runner.rejected == {}


async def test_an_admission_signed_by_a_host_is_rejected_by_the_fold(grid: Grid) -> None:
    """(e): the server refuses a host's publish on the control stream; the same event landed there
    anyway (signed by the host for that subject, or for its own and reflected) is rejected by
    every fold by reason, and the host's engine stays unrouted."""
    g = grid
    await restrict(g.controller_log, allow_hosts=())
    with engine() as evil_engine:
        await g.start_agent(EVIL)
        await register(g, EVIL, evil_engine.url)
        forged = RouteAdmitted(event_id=new_event_id(), at=time.time(), host_id=EVIL, model_id=RESTRICTED, kind=KIND,
                               url_fingerprint=routes.url_fingerprint(evil_engine.url))
        subject = route_subject(EVIL, RESTRICTED)
        data = codec.encode(forged)
        evil = Identity.from_creds(g.creds(Role.HOST, host_id=EVIL))
        # The server itself refuses the host's publish.
        nc = await raw_client(g.server, g.creds(Role.HOST, host_id=EVIL))
        try:
            before = await g.controller_log.last_sequence(CONTROL_STREAM)
            await nc.publish(subject, data, headers=evil.sign(subject, data))
            await nc.flush()
            await asyncio.sleep(0.5)
            errors = nc.permission_errors  # type: ignore[attr-defined]
            assert any("permissions violation" in str(e).lower() for e in errors), errors
            assert await g.controller_log.last_sequence(CONTROL_STREAM) == before
        finally:
            await nc.close()
        # Landed anyway (a reflection, or a future permission mistake).
        for headers in (evil.sign(subject, data), evil.sign(host_subject(EVIL, "x"), data)):
            own, g.controller_log.authorship = g.controller_log.authorship, None
            try:
                await g.controller_log.append_raw(subject, data, msg_id=new_event_id(), headers=headers)
            finally:
                g.controller_log.authorship = own
        runner = ProjectionRunner(CORE_PROJECTIONS)
        await runner.catch_up(g.controller_log)
        assert runner["catalog"].routes.admitted == {}
        assert runner.rejected == {NOT_PERMITTED: 1, BAD_SIGNATURE: 1}
        assert {(r.subject, r.role) for r in runner.gate.rejections} == {(subject, "host"), (subject, "")}

        await g.start_gateway()
        assert g.gateway is not None
        table = await g.routed_when(lambda t: EVIL in t)
        assert table == {EVIL: routing.EXCLUDED_UNPLACED}
        assert g.gateway.runner.rejected == {NOT_PERMITTED: 1, BAD_SIGNATURE: 1}
        answers = await g.chats()
        assert all(host is None for _, host in answers) and evil_engine.chats == 0


async def test_on_the_one_machine_grid_engine_add_admits_with_the_operators_credential(grid: Grid) -> None:
    """`gridctl up`: the machine's grid home holds the operator credential beside the host's, and
    its owner is the operator, so `engine add` there appends the admission itself and says so
    (unless --request-only); the engine is then routed."""
    g = grid
    await restrict(g.controller_log)
    with engine() as local_engine:
        await g.start_agent(HONEST)
        state_dir = str(g.home(HONEST) / "agent")
        rc, out, err = await gridctl(g.operator_home, "engine", "add", local_engine.url, "--model", RESTRICTED,
                                     "--kind", KIND, "--state-dir", state_dir, "--nats", g.server.url,
                                     "--request-only")
        assert rc == 0 and "takes no traffic until an operator admits it" in out, err + out
        rc, out, err = await gridctl(g.operator_home, "engine", "add", local_engine.url, "--model", RESTRICTED,
                                     "--kind", KIND, "--state-dir", state_dir, "--nats", g.server.url)
        assert rc == 0, err + out
        assert "admitted as a route with this grid home's operator credential" in out, out
        runner = ProjectionRunner(CORE_PROJECTIONS)
        await runner.catch_up(g.controller_log)
        record = routes.admitted_route(runner["catalog"].routes, HONEST, RESTRICTED)
        assert record is not None and record.url_fingerprint == routes.url_fingerprint(local_engine.url)
        await g.start_gateway()
        await g.routed_when(lambda t: t.get(HONEST, "x") is None)
        assert await g.chats() == [(200, HONEST)] * USERS and local_engine.chats == USERS
