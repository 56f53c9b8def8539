"""Start, inspect and stop a logical fleet: the orchestration behind `gridctl test ...`.

Every component is the ordinary process an operator would run (`gridctl serve controller`,
`gridctl serve gateway`, `gridctl node start --join-token-file`), started detached with its own
grid home, so the fleet exercises the same code paths as machines on a network. Only this
module knows the layout under the fleet root:

    fleet.json           the state file (grid.testfleet.state)
    control/             grid home of NATS, controller, gateway: authority, operator token
    hosts/<id>/          a logical host's grid home: artifacts, engine key, agent state, join token
    shares/              the machine's capacity ledger, shared by every logical host (symlinked
                         as hosts/<id>/capacity-shares) so N hosts never offer more than the machine
    models/              the artifact cache the hosts' caches are seeded from (hard links)
    logs/                one log file per process
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec

from grid.config import GridConfig
from grid.testfleet import netns
from grid.testfleet.procs import alive, kill_now, prove, spawn, terminate
from grid.testfleet.sizing import (
    MAX_MACHINES,
    Model,
    engine_threads,
    machine_memory_mb,
    plan_capacities,
    prepare_model,
    seed_cache,
)
from grid.testfleet.state import (
    FleetError,
    FleetSettings,
    FleetManifest,
    FleetStateError,
    HostManifest,
    ProcessRecord,
    load_state,
    remove_state,
    save_state,
)
from grid.transport.embedded import free_port

FLEET_DIR = "testfleet"

# Engine ports: host i uses [base + i*span, base + i*span + span - 1].
DEFAULT_ENGINE_PORT_BASE = 41000
ENGINE_PORT_SPAN = 20
# Fast enough that a test sees a host go stale and a plan change within seconds; the freshness
# window itself is the product's (grid.fleet.HEARTBEAT_TIMEOUT_SECONDS).
HEARTBEAT_INTERVAL_SECONDS = 1.0
TICK_INTERVAL_SECONDS = 2.0
AGENT_DRAIN_DEADLINE_SECONDS = 30.0
# A test fleet's agents are killed and started again by hand (`gridctl test kill`, tests), often
# later than the grace a machine's own agent gets (grid.agent.warden): their engines wait this
# long to be adopted before the warden stops them.
AGENT_ORPHAN_GRACE_SECONDS = 300.0
STOP_TIMEOUT_SECONDS = 45.0
HTTP_TIMEOUT_SECONDS = 5.0

Say = Callable[[str], None]


class _Exited(Exception):
    """A component died while the fleet waited for it (not worth waiting any longer)."""


@dataclass(frozen=True)
class FleetSpec:
    machines: int
    model: Path | None = None  # a GGUF file; None: the bundled SmolLM2
    capacities_gib: tuple[float, ...] | None = None
    netns: bool = False
    # How many hosts (the first k) get the model in their artifact cache before they start; the
    # others must obtain it from the grid. None: all of them.
    preload_hosts: int | None = None
    engine_port_base: int = DEFAULT_ENGINE_PORT_BASE
    # Threads per llama.cpp engine; None: the machine's CPUs shared among the logical hosts.
    engine_threads: int | None = None
    wait: bool = True
    ready_timeout: float = 240.0


def fleet_root(config: GridConfig | None = None) -> Path:
    """Where the fixture lives: inside the grid home, apart from its `gridctl up` grid."""
    return (config or GridConfig.from_environ()).home / FLEET_DIR


# --- start ----------------------------------------------------------------------------------


def _gridctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "grid.cli.main", *args]


def _env(home: Path) -> dict[str, str]:
    """The caller's environment with this component's grid home and nothing that would point it
    at another grid (a NATS URL, an agent state directory)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GRID_NATS_URL", "GRID_AGENT_STATE_DIR", "GRID_HOME")}
    env["GRID_HOME"] = str(home)
    return env


def _operator_token(state: FleetManifest) -> str:
    from grid.secrets import read_secret

    return read_secret(GridConfig(home=Path(state.control_home), nats_url=None).operator_token_path)


def gateway_headers() -> dict[str, str]:
    """Headers for this process's own requests to the fleet's gateway. The gateway runs with this
    environment (_env), so when GRID_GATEWAY_API_KEYS makes it require client keys, the first of
    them is the fleet's key too; a variable the gateway could not read is refused before anything
    starts. (The key stays in this process: it is never printed or recorded.)"""
    from grid.gateway.settings import API_KEYS_ENV, parse_api_keys

    try:
        keys = parse_api_keys(os.environ.get(API_KEYS_ENV))
    except (ValueError, OSError) as exc:
        raise FleetError(f"the gateway's client keys ({API_KEYS_ENV}) cannot be read: {exc}") from exc
    return {"Authorization": f"Bearer {keys[0]}"} if keys else {}


def admin_request(state: FleetManifest, method: str, path: str, body: Any = None) -> Any:
    """The fleet controller's admin API as the operator (JSON answer; FleetError on refusal)."""
    headers = {"X-Grid-Allocator-Token": _operator_token(state)}
    try:
        resp = httpx.request(method, state.admin_url + path, headers=headers, timeout=HTTP_TIMEOUT_SECONDS,
                             content=msgspec.json.encode(body) if body is not None else None, trust_env=False)
    except httpx.HTTPError as exc:
        raise FleetError(f"the fleet's admin API at {state.admin_url} does not answer: {exc}") from exc
    if resp.status_code >= 400:
        raise FleetError(f"admin API {method} {path}: {resp.status_code} {resp.text[:300]}")
    return resp.json()


def _wait(what: str, probe: Callable[[], Any], timeout: float, *, watch: list[ProcessRecord | None] = (),  # type: ignore[assignment]
          interval: float = 0.25) -> Any:
    """Poll `probe` until it returns something truthy; fail early when a watched process died."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        for record in watch:
            if record is not None and not alive(record):
                raise FleetError(f"{what}: the process (pid {record.pid}) exited; see {record.log}:\n"
                                 + _tail(Path(record.log)))
        try:
            value = probe()
        except _Exited as exc:
            raise FleetError(f"{what}: {exc}") from exc
        except (httpx.HTTPError, FleetError, OSError, ValueError) as exc:
            value, last = None, exc
        if value:
            return value
        time.sleep(interval)
    raise FleetError(f"{what} did not happen within {timeout:.0f}s" + (f" (last: {last})" if last else ""))


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _settings(spec: FleetSpec, model: Model, caps: tuple[int, ...]) -> FleetSettings:
    return FleetSettings(machines=spec.machines, model_id=model.model_id, artifact_sha256=model.sha256,
                         model_memory_mb=model.memory_mb, capacities_mb=caps, netns=spec.netns,
                         engine_threads=spec.engine_threads or engine_threads(spec.machines))


def _check_spec(spec: FleetSpec) -> None:
    """What can be refused before any work (the capacities are checked once the model's size is known)."""
    if not 1 <= spec.machines <= MAX_MACHINES:
        raise FleetError(f"--machines must be 1..{MAX_MACHINES}, not {spec.machines}")
    if spec.capacities_gib is not None and len(spec.capacities_gib) != spec.machines:
        raise FleetError(f"--capacities-gib lists {len(spec.capacities_gib)} capacities for {spec.machines} "
                         "machines; give one per machine")
    if spec.preload_hosts is not None and not 0 <= spec.preload_hosts <= spec.machines:
        raise FleetError(f"--preload-hosts must be 0..{spec.machines}, not {spec.preload_hosts}")
    if not 1024 <= spec.engine_port_base <= 65535 - ENGINE_PORT_SPAN * (spec.machines + 1):
        raise FleetError(f"--engine-port-base {spec.engine_port_base} leaves no room for {spec.machines} port ranges")


def processes(state: FleetManifest) -> dict[str, ProcessRecord | None]:
    out: dict[str, ProcessRecord | None] = {"nats": state.nats, "controller": state.controller,
                                            "gateway": state.gateway}
    out.update({f"agent {h.host_id}": h.agent for h in state.hosts})
    return out


def start_fleet(root: Path, spec: FleetSpec, say: Say = lambda _: None) -> FleetManifest:
    """Start the fleet (idempotent: the same settings while it runs are a no-op)."""
    existing = load_state(root)
    _check_spec(spec)
    gateway_headers()  # refused now rather than after the gateway started
    model = prepare_model(root, spec.model, say)
    caps = plan_capacities(spec.machines, spec.capacities_gib, model.memory_mb, machine_memory_mb())
    settings = _settings(spec, model, caps)
    if existing is not None:
        down = [name for name, rec in processes(existing).items() if not alive(rec)]
        if existing.settings != settings:
            raise FleetError(f"a test fleet with other settings is recorded in {root} "
                             f"({existing.settings.machines} machines, netns={existing.settings.netns}); "
                             "`gridctl test stop` first")
        if down:
            raise FleetError(f"the test fleet in {root} is partly down ({', '.join(down)}); "
                             "`gridctl test stop`, then start again")
        say("the test fleet is already running with these settings")
        return existing
    if spec.netns:
        netns.check_available()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    state = FleetManifest(settings=settings, root=str(root), control_home=str(root / "control"),
                       started_at=time.time())
    save_state(state)
    try:
        _start(state, spec, model, say)
    except BaseException:
        say("start failed: removing what was started")
        stop_fleet(root, say)
        raise
    return state


def _start(state: FleetManifest, spec: FleetSpec, model: Model, say: Say) -> None:
    from grid.identity.authority import Authority
    from grid.identity.local import authority_dir, ensure_local_credentials
    from grid.identity.tls import TLSMaterial
    from grid.localgrid import bundled_profile
    from grid.secrets import load_or_create_secret

    root = Path(state.root)
    control = Path(state.control_home)
    GridConfig(home=control, nats_url=None).ensure_home()
    logs = root / "logs"
    if spec.netns:
        say(f"network: bridge {netns.BRIDGE} at {netns.BRIDGE_ADDRESS}, one namespace per machine")
        state.bridge = netns.create_bridge()
        save_state(state)
    listen = netns.BRIDGE_ADDRESS if spec.netns else "127.0.0.1"

    # Identity: the authority and the control plane's credentials; TLS off loopback.
    ensure_local_credentials(control, host_ids=[], now=time.time())
    load_or_create_secret(GridConfig(home=control, nats_url=None).operator_token_path)
    tls = None
    if spec.netns:
        tls = TLSMaterial(authority_dir(control) / "tls").ensure([listen, "127.0.0.1"],
                                                                   now=dt.datetime.now(dt.timezone.utc))
    say("starting NATS JetStream (secured)")
    server = _DetachedNats(control / "nats", Authority(authority_dir(control)), tls=tls, host=listen)
    server.spawn()
    state.nats = server.record
    state.nats_url = server.url
    save_state(state)
    server.wait_ready()

    say("starting the controller")
    admin_port = free_port()
    state.controller = spawn(_gridctl("serve", "controller", "--nats", state.nats_url, "--admin-port", str(admin_port),
                                      "--assume-durable", "--tick-interval", str(TICK_INTERVAL_SECONDS),
                                      "--log-format", "json"),
                             env=_env(control), log=logs / "controller.log")
    state.admin_url = f"http://127.0.0.1:{admin_port}"
    save_state(state)
    _wait("the controller's admin API", lambda: admin_request(state, "GET", "/allocator/status"), 60,
          watch=[state.controller])
    profile = bundled_profile(model_id=model.model_id, artifact_sha256=model.sha256, memory_mb=model.memory_mb,
                              min_replicas=1, max_replicas=spec.machines)
    body = {k: v for k, v in msgspec.to_builtins(profile).items() if k != "model_id"}
    admin_request(state, "PUT", f"/allocator/models/{model.model_id}", body)
    admin_request(state, "PUT", "/allocator/mode", {"mode": "automatic"})

    say("starting the gateway")
    gateway_port = free_port()
    state.gateway = spawn(_gridctl("serve", "gateway", "--nats", state.nats_url, "--host", "127.0.0.1",
                                   "--port", str(gateway_port), "--log-format", "json"),
                          env=_env(control), log=logs / "gateway.log")
    state.gateway_url = f"http://127.0.0.1:{gateway_port}"
    save_state(state)

    preload = spec.machines if spec.preload_hosts is None else spec.preload_hosts
    if preload < spec.machines:
        # The hosts that start without the model get it from the grid, as a new machine would.
        say("storing the model in the grid's artifact store (machines without it fetch it from there)")
        pushed = subprocess.run(_gridctl("model", "push", str(model.blob), "--nats", state.nats_url, "--json"),
                                env=_env(control), capture_output=True, text=True, timeout=600,
                                stdin=subprocess.DEVNULL)
        if pushed.returncode != 0:
            raise FleetError(f"gridctl model push failed: {(pushed.stderr or pushed.stdout).strip()[-400:]}")
    shares = root / "shares"
    shares.mkdir(exist_ok=True, mode=0o700)
    for i, cap in enumerate(state.settings.capacities_mb, start=1):
        host = _prepare_host(state, i, cap, spec, model if i <= preload else None, shares, tls)
        state.hosts.append(host)
        save_state(state)
        _spawn_agent(state, host)
        save_state(state)
        say(f"machine {host.host_id}: failure domain {host.failure_domain}, {cap} MB, engine ports "
            f"{host.port_range[0]}-{host.port_range[1]}" + (f", {host.netns} at {host.address}" if host.netns else ""))

    client_key = gateway_headers()  # a gateway that requires client keys answers 401 without one
    _wait("the gateway", lambda: httpx.get(state.gateway_url + "/v1/models", headers=client_key, timeout=2,
                                           trust_env=False).status_code == 200, 60, watch=[state.gateway])
    want = {h.host_id for h in state.hosts}
    say(f"waiting for {len(want)} agents to join and report")
    retries = {h.host_id: JOIN_RETRIES for h in state.hosts}

    def reporting() -> bool:
        for h in state.hosts:
            if alive(h.agent):
                continue
            assert h.agent is not None
            if retries[h.host_id] > 0 and _join_found_no_responder(h):
                # Nothing redeemed the token (nobody answered), so it still admits this host once.
                retries[h.host_id] -= 1
                say(f"machine {h.host_id}: the join request found no responder; trying again")
                _spawn_agent(state, h)
                save_state(state)
                continue
            raise _Exited(f"the agent of {h.host_id} (pid {h.agent.pid}) exited; see {h.agent.log}:\n"
                          + _tail(Path(h.agent.log)))
        return want <= fresh_hosts(state)

    _wait("every agent reporting", reporting, 120)
    if spec.wait:
        say(f"waiting for {model.model_id} to be READY")
        _wait(f"{model.model_id} READY on a machine", lambda: ready_hosts(state, model.model_id), spec.ready_timeout,
              watch=[state.controller, state.gateway, *(h.agent for h in state.hosts)], interval=0.5)
    state.ready = True
    save_state(state)


def _prepare_host(state: FleetManifest, index: int, capacity_mb: int, spec: FleetSpec, model: Model | None,
                  shares: Path, tls: Any) -> HostManifest:
    """A logical host's home, capacity ledger link, namespace and join token (real invitation)."""
    from grid.agent.launch import IDENTITY_DIR
    from grid.agent.state import AgentPaths
    from grid.identity.admin import invite
    from grid.secrets import write_owner_only

    root = Path(state.root)
    host_id, domain = f"h{index}", f"fd{index}"
    home = root / "hosts" / host_id
    config = GridConfig(home=home, nats_url=None)
    config.ensure_home()
    # A host home left by a stopped fleet keeps its enrolment, which names that fleet's NATS
    # address; the agent runs as a kept enrolment rather than redeem a token, so this new fleet's
    # host joins afresh with the invitation made below.
    shutil.rmtree(AgentPaths.for_config(config).root / IDENTITY_DIR, ignore_errors=True)
    ledger = home / "capacity-shares"
    if not ledger.is_symlink():
        ledger.symlink_to(shares, target_is_directory=True)
    if model is not None:
        seed_cache(home, model)
    lo = spec.engine_port_base + index * ENGINE_PORT_SPAN
    record = HostManifest(host_id=host_id, failure_domain=domain, capacity_mb=capacity_mb,
                        port_range=(lo, lo + ENGINE_PORT_SPAN - 1), home=str(home))
    if spec.netns:
        record.netns, record.address, record.veth = netns.create_host(index)
    _, token = invite(Path(state.control_home), (state.nats_url,), host_id=host_id, now=time.time(),
                      ttl_seconds=600, failure_domain=domain, tags=("testfleet",), dedicated=True,
                      tls_fingerprint=tls.server_fingerprint() if tls is not None else None)
    write_owner_only(home / "join.token", (token + "\n").encode())
    return record


def _spawn_agent(state: FleetManifest, host: HostManifest) -> None:
    """`gridctl node start` for one logical host (inside its namespace); it joins with the token
    the first time and runs as the host its credential names afterwards."""
    home = Path(host.home)
    command = _gridctl("node", "start", "--join-token-file", str(home / "join.token"),
                       "--memory-mb", str(host.capacity_mb),
                       "--port-range", f"{host.port_range[0]}-{host.port_range[1]}",
                       "--heartbeat-interval", str(HEARTBEAT_INTERVAL_SECONDS),
                       "--drain-deadline", str(AGENT_DRAIN_DEADLINE_SECONDS),
                       "--orphan-grace", str(AGENT_ORPHAN_GRACE_SECONDS),
                       "--engine-threads", str(state.settings.engine_threads), "--log-format", "json")
    host.agent = spawn([*netns.exec_prefix(host.netns), *command], env=_env(home), runs=command,
                       log=Path(state.root) / "logs" / f"agent-{host.host_id}.log")


# nats-server may answer "no responders" to a request made right after a client connected
# (seen about 1 in 20 here; grid.infer.client retries for the same reason).
JOIN_RETRIES = 2
_NO_RESPONDER = "could not join through"


def _join_found_no_responder(host: HostManifest) -> bool:
    assert host.agent is not None
    tail = _tail(Path(host.agent.log), 600)
    return _NO_RESPONDER in tail and "NoRespondersError" in tail


class _DetachedNats:
    """The secured embedded server, started so it outlives `gridctl test start` (the embedded
    server of `gridctl up` dies with its starter; this one is stopped by `gridctl test stop`)."""

    def __init__(self, store_dir: Path, authority: Any, *, tls: Any, host: str) -> None:
        from grid.identity.server import SecuredEmbeddedNats

        self.server = SecuredEmbeddedNats(store_dir, authority, tls=tls, host=host)
        self.record: ProcessRecord | None = None

    @property
    def url(self) -> str:
        return self.server.url

    def spawn(self) -> None:
        from grid.transport.embedded import find_nats_server

        s = self.server
        s.port, s.monitor_port = free_port(s.host), free_port(s.host)
        config = s._write_config()  # the same configuration `gridctl up` runs with
        self.record = spawn([str(find_nats_server()), "-c", str(config)], env=os.environ, log=s.log_path)

    def wait_ready(self) -> None:
        s = self.server
        url = f"http://{s.host}:{s.monitor_port}/healthz?js-enabled-only=true"
        _wait("NATS ready", lambda: httpx.get(url, timeout=1, trust_env=False).status_code == 200, 30,
              watch=[self.record])


# --- inspect --------------------------------------------------------------------------------


def controller_status(state: FleetManifest) -> dict[str, Any]:
    return admin_request(state, "GET", "/allocator/status")  # type: ignore[no-any-return]


def fresh_hosts(state: FleetManifest) -> set[str]:
    return {h["host_id"] for h in controller_status(state)["hosts"] if h["fresh"]}


def ready_hosts(state: FleetManifest, model_id: str) -> set[str]:
    """Hosts whose fresh heartbeat reports `model_id` READY."""
    out = set()
    for h in controller_status(state)["hosts"]:
        if h["fresh"] and any(r["model_id"] == model_id and r["state"] == "ready" for r in h["residencies"]):
            out.add(h["host_id"])
    return out


def fleet_status(root: Path) -> dict[str, Any] | None:
    """The recorded fleet with each process checked, and the controller's view of each host."""
    state = load_state(root)
    if state is None:
        return None
    view: dict[str, Any] = {}
    problem = None
    if alive(state.controller):
        try:
            view = {h["host_id"]: h for h in controller_status(state)["hosts"]}
        except FleetError as exc:
            problem = str(exc)
    hosts = []
    for h in state.hosts:
        seen = view.get(h.host_id, {})
        hosts.append({
            "host_id": h.host_id, "failure_domain": h.failure_domain, "capacity_mb": h.capacity_mb,
            "port_range": list(h.port_range), "netns": h.netns, "address": h.address, "home": h.home,
            "agent_pid": h.agent.pid if h.agent else None, "agent_running": alive(h.agent),
            "fresh": seen.get("fresh", False), "state": seen.get("state"),
            "residencies": [{"model_id": r["model_id"], "state": r["state"]} for r in seen.get("residencies", [])],
        })
    return {
        "root": state.root, "ready": state.ready, "settings": msgspec.to_builtins(state.settings),
        "nats_url": state.nats_url, "gateway_url": state.gateway_url, "admin_url": state.admin_url,
        "operator_token_file": str(GridConfig(home=Path(state.control_home), nats_url=None).operator_token_path),
        "bridge": state.bridge,
        "processes": {name: {"pid": rec.pid if rec else None, "running": alive(rec), "log": rec.log if rec else None}
                      for name, rec in processes(state).items()},
        "hosts": hosts, "controller_problem": problem,
    }


# --- actions on one host (tests, and an operator poking the fixture) --------------------------


def kill_agent(root: Path, host_id: str) -> int:
    """SIGKILL one host's agent (its engines live on, for adoption). Returns the pid killed."""
    state = _require(root)
    host = state.host(host_id)
    if host.agent is None or not kill_now(host.agent):
        raise FleetError(f"the agent of {host_id} is not running")
    return host.agent.pid


def restart_agent(root: Path, host_id: str) -> ProcessRecord:
    """Start a host's agent again (after a kill or a crash), as the host it joined as."""
    state = _require(root)
    host = state.host(host_id)
    if alive(host.agent):
        raise FleetError(f"the agent of {host_id} is running (pid {host.agent.pid})")  # type: ignore[union-attr]
    _spawn_agent(state, host)
    save_state(state)
    assert host.agent is not None
    return host.agent


def host_cli(state: FleetManifest, host_id: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `gridctl <args>` as that logical host's operator would (its grid home, its namespace)."""
    host = state.host(host_id)
    argv = [*netns.exec_prefix(host.netns), *_gridctl(*args)]
    return subprocess.run(argv, env=_env(Path(host.home)), capture_output=True, text=True, timeout=timeout)


def _require(root: Path) -> FleetManifest:
    state = load_state(root)
    if state is None:
        raise FleetError(f"no test fleet is recorded in {root} (`gridctl test start` starts one)")
    return state


# --- stop -----------------------------------------------------------------------------------


def _engine_records(host: HostManifest) -> list[ProcessRecord]:
    """The engines a host's agent recorded (proof: pid, birth time, command line), so engines an
    agent left behind (it was killed and not restarted) are stopped too, and nothing else."""
    from grid.agent.state import AgentPaths, decode_state

    paths = AgentPaths.for_config(GridConfig(home=Path(host.home), nats_url=None))
    try:
        agent_state = decode_state(paths.state.read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return []
    out = []
    for res in agent_state.residencies.values():
        proof = res.process
        if proof is not None and proof.create_time is not None and proof.cmdline:
            out.append(ProcessRecord(pid=proof.pid, create_time=proof.create_time, cmdline=tuple(proof.cmdline),
                                     log="", start_stamp=proof.start_stamp))
    return out


def stop_fleet(root: Path, say: Say = lambda _: None) -> list[str]:
    """Stop exactly the recorded processes and remove the recorded network objects. Returns
    the problems (empty: all gone, state file removed; otherwise it is kept for another try)."""
    state = load_state(root)
    if state is None:
        return []
    # Controller first: nothing may re-warm what the agents are draining.
    say("stopping the controller")
    terminate([state.controller], timeout=15)
    agents = [h.agent for h in state.hosts]
    if any(alive(a) for a in agents):
        say("stopping the agents (they drain and unload their engines)")
    terminate(agents, timeout=STOP_TIMEOUT_SECONDS)
    leftovers = [rec for h in state.hosts for rec in _engine_records(h) if prove(rec) is not None]
    if leftovers:
        say(f"stopping {len(leftovers)} engine(s) an agent left behind")
        terminate(leftovers, timeout=10)
    say("stopping the gateway and NATS")
    terminate([state.gateway], timeout=15)
    terminate([state.nats], timeout=15)
    problems = [f"{name} (pid {rec.pid}) still runs" for name, rec in processes(state).items() if alive(rec)]
    if state.bridge or any(h.netns for h in state.hosts):
        say("removing the network namespaces and the bridge")
        problems += netns.remove([h.netns for h in state.hosts if h.netns], [h.veth for h in state.hosts if h.veth],
                                 state.bridge)
    if not problems:
        remove_state(root)
    return problems


__all__ = [
    "FleetError", "FleetSpec", "FleetStateError", "admin_request", "controller_status", "fleet_root",
    "fleet_status", "fresh_hosts", "host_cli", "kill_agent", "ready_hosts", "restart_agent", "start_fleet",
    "stop_fleet",
]
