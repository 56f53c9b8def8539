"""Start a host agent in the foreground from its launch options (what `gridctl node start` does).

Three steps, each usable on its own: `prepare` checks the options and this machine (one agent per
state directory, the runtime, the join) and returns a `Launch` or a `Refused` naming why;
`run_launch` connects to the grid, runs the agent until SIGTERM/SIGINT and returns the process exit
code; `launch` is both, on Grid's event loop. The pid file (`PidRecord`) lets `gridctl node stop`
signal exactly this process; the enrolment record (`Joined`) is what `gridctl node join` left.

Exit codes: 0 after a clean stop; 1 refused before starting or the grid unreachable; 2 the agent
could not start (or GRID_EVENT_LOOP names no usable loop).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgspec
import psutil

from grid import eventloop
from grid.agent.lock import is_locked, read_holder
from grid.agent.options import AgentOptions
from grid.agent.protection import ProtectionPolicy
from grid.agent.state import AgentPaths, atomic_write
from grid.agent.warden import ORPHAN_GRACE_SECONDS
from grid.config import GridConfig, NatsUrlNotFound, resolve_nats_url
from grid.procstart import CREATE_TIME_TOLERANCE_SECONDS, same_start, start_stamp
from grid.tasks import cancel_and_wait

# Where `gridctl node join` keeps this host's credential, CA and enrolment (owner-only).
IDENTITY_DIR = "identity"
ENROLMENT_FILE = "enrolment.json"

EXIT_STOPPED = 0
EXIT_REFUSED = 1  # refused before starting, or the grid could not be reached
EXIT_START_FAILED = 2
EXIT_REVOKED = 3  # the operator revoked this host's credential: a new invitation is needed

# Why a launch (or a join) is refused before anything starts.
ALREADY_RUNNING = "already_running"
RUNTIME_MISSING = "runtime_missing"
INVALID_OPTION = "invalid_option"
ENROLMENT_DAMAGED = "enrolment_damaged"
JOIN_REFUSED = "join_refused"
HOST_MISMATCH = "host_mismatch"
NO_GRID = "no_grid"


@dataclass(frozen=True)
class Refused:
    """Why a launch (or a join) stops before anything starts; the CLI prints `message`."""

    reason: str  # one of the constants above
    message: str


# --- the pid file -----------------------------------------------------------------------------


class PidRecord(msgspec.Struct, kw_only=True):
    pid: int
    create_time: float
    cmdline: tuple[str, ...]
    instance: str
    host_id: str = ""
    started_at: float = 0.0
    start_stamp: str | None = None  # grid.procstart.start_stamp


_pid_decoder = msgspec.json.Decoder(PidRecord)


def read_pid_record(paths: AgentPaths) -> PidRecord | None:
    try:
        return _pid_decoder.decode(paths.pid_file.read_bytes())
    except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def verify_pid(record: PidRecord) -> str:
    """'running' only if the PID is the exact agent instance that wrote the record."""
    try:
        proc = psutil.Process(record.pid)
        with proc.oneshot():
            if not same_start(record.pid, proc.create_time(), recorded_stamp=record.start_stamp,
                              recorded_create_time=record.create_time, tolerance=CREATE_TIME_TOLERANCE_SECONDS):
                return "reused"
            if tuple(proc.cmdline()) != tuple(record.cmdline):
                return "reused"
            if proc.status() == psutil.STATUS_ZOMBIE:
                return "gone"
    except psutil.NoSuchProcess:
        return "gone"
    except psutil.Error:
        return "unverifiable"
    return "running"


def this_process_record() -> PidRecord:
    me = psutil.Process()
    return PidRecord(
        pid=me.pid, create_time=me.create_time(), cmdline=tuple(me.cmdline()), instance=uuid.uuid4().hex,
        started_at=time.time(), start_stamp=start_stamp(me.pid),
    )


# --- joining ----------------------------------------------------------------------------------


class Joined(msgspec.Struct, frozen=True):
    """What `node join` received: the host id and how to reach the grid as that host."""

    host_id: str
    server: str
    creds_path: str
    ca_path: str | None = None
    failure_domain: str | None = None
    tags: tuple[str, ...] = ()
    dedicated: bool = False


def read_joined(paths: AgentPaths) -> Joined | Refused | None:
    """This state directory's enrolment, None if it never joined."""
    path = paths.root / IDENTITY_DIR / ENROLMENT_FILE
    if not path.exists():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=Joined)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return Refused(ENROLMENT_DAMAGED, f"{path} is damaged ({exc}); join again with a new invitation")


def redeem_join_token(token: str, paths: AgentPaths) -> Joined | Refused:
    """Redeem `token` for this state directory's host credential and keep the enrolment."""
    from grid.identity.enrolment import EnrolmentRefused
    from grid.identity.enrolment import join as enrol
    from grid.identity.invitations import InvitationError, JoinToken
    from grid.secrets import write_owner_only

    paths.ensure()
    try:
        parsed = JoinToken.decode(token)
    except InvitationError as exc:
        return Refused(JOIN_REFUSED, str(exc))
    try:
        outcome = asyncio.run(enrol(parsed, paths.root / IDENTITY_DIR))
    except Exception as exc:  # unreachable server, TLS pin mismatch, timeout: nothing was written
        return Refused(JOIN_REFUSED,
                       f"could not join through {', '.join(parsed.servers)}: {type(exc).__name__}: {exc}")
    if isinstance(outcome, EnrolmentRefused):
        return Refused(JOIN_REFUSED, f"the grid refused to join: {outcome.reason}")
    # Every server of the token, comma-separated: `node start` fails over between them.
    joined = Joined(host_id=outcome.host_id, server=",".join(parsed.servers), creds_path=outcome.creds_path,
                    ca_path=outcome.ca_path, failure_domain=outcome.failure_domain, tags=outcome.tags,
                    dedicated=outcome.dedicated)
    write_owner_only(paths.root / IDENTITY_DIR / ENROLMENT_FILE, msgspec.json.encode(joined))
    return joined


# --- preparing a launch -----------------------------------------------------------------------


def _configured_nats_url(explicit: str | None, cfg: GridConfig) -> str | Refused:
    try:
        return resolve_nats_url(explicit, cfg)
    except NatsUrlNotFound as exc:
        return Refused(NO_GRID, f"no grid found: start one with `gridctl up`, or pass --nats URL / set "
                                f"GRID_NATS_URL (looked for {exc.recorded})")


# How recently a user must have touched a non-dedicated (employee) machine for it to throttle,
# when `--yield-to-user` is not given. The seed names no figure; five minutes is the common
# "away" mark (screen savers, chat presence): long enough that reading a page is not "gone",
# short enough that the capacity comes back over lunch.
DEFAULT_YIELD_TO_USER_SECONDS = 300.0


def yield_to_user_seconds(given: float | None, joined: Joined | None) -> float | None:
    """The protection policy's `user_active_seconds`: `--yield-to-user` when given (0 turns
    yielding off), else the default on a machine enrolled without `--dedicated`, else None. A
    machine that never joined (`gridctl up`'s own host, `node start` with `--nats`) keeps not
    yielding: nothing says a person uses it."""
    if given is not None:
        return given if given > 0 else None
    if joined is not None and not joined.dedicated:
        return DEFAULT_YIELD_TO_USER_SECONDS
    return None


# `--cpu-throttle N` leaves throttling below N minus this, the default pair's (90, 75) hysteresis.
CPU_RECOVERY_MARGIN = 15.0


def cpu_throttle_thresholds(given: float | None) -> tuple[float, float]:
    """The protection policy's CPU (entry, recovery) pair from `--cpu-throttle`: the policy's
    default when not given; N enters at N percent and leaves below N - CPU_RECOVERY_MARGIN; 0
    never throttles for CPU. The reading is the whole machine's, Grid's own engines included, so
    a dedicated server kept busy by its own inference may want 0."""
    if given is None:
        return ProtectionPolicy().cpu_throttle
    if given <= 0:
        return (math.inf, math.inf)
    return (given, max(0.0, given - CPU_RECOVERY_MARGIN))


@dataclass(frozen=True)
class LaunchOptions:
    """The options of `gridctl node start`, as given (see its help for each)."""

    nats: str | None = None
    host_id: str | None = None
    capacity_mb: int | None = None
    reserved_mb: int = 0
    failure_domain: str = "default"
    tags: tuple[str, ...] = ()  # as given: each may hold several, comma-separated
    data_tier: str = "internal"
    port_range: str = "38000-38999"
    heartbeat_interval: float = 2.0
    sample_interval: float = 2.0
    drain_deadline: float = 60.0
    orphan_grace: float = ORPHAN_GRACE_SECONDS
    throttle_fraction: float = 0.5
    yield_to_user: float | None = None
    cpu_throttle: float | None = None
    llama_server: str | None = None
    engine_threads: int | None = None
    state_dir: Path | None = None
    join_token_file: Path | None = None
    # How the grid's URL is found when this machine has not joined (the CLI passes its own, which
    # checks the URL's form too); a Refused ends the launch.
    resolve_url: Callable[[str | None, GridConfig], str | Refused] = field(default=_configured_nats_url)


@dataclass(frozen=True)
class Launch:
    """A checked launch: where to connect, as whom, and the agent's options."""

    config: GridConfig
    paths: AgentPaths
    url: str
    joined: Joined | None
    agent_options: AgentOptions
    record: PidRecord


def parse_port_range(value: str) -> tuple[int, int] | Refused:
    try:
        lo_s, hi_s = value.split("-", 1)
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        return Refused(INVALID_OPTION, f"--port-range must look like 38000-38999, not {value!r}")
    if not (1024 <= lo <= hi <= 65535):
        return Refused(INVALID_OPTION, "--port-range must be within 1024-65535 and low <= high")
    return lo, hi


def _check_options(options: LaunchOptions) -> Refused | None:
    from grid.agent.engines.runtime import RuntimeChoiceError, find_runtime
    from grid.events.control import DATA_TIERS

    try:
        find_runtime(options.llama_server)  # a named runtime that is not there is refused before anything starts
    except RuntimeChoiceError as exc:
        return Refused(RUNTIME_MISSING, str(exc))
    if options.data_tier not in DATA_TIERS:
        return Refused(INVALID_OPTION, f"--data-tier must be one of {', '.join(DATA_TIERS)}, not {options.data_tier!r}")
    if options.capacity_mb is not None and options.capacity_mb <= 0:
        return Refused(INVALID_OPTION, f"--memory-mb must be a positive number of MB, not {options.capacity_mb}")
    if options.orphan_grace < 0:
        return Refused(INVALID_OPTION, f"--orphan-grace must be 0 or more seconds, not {options.orphan_grace:g}")
    if options.engine_threads is not None and not 1 <= options.engine_threads <= 256:
        return Refused(INVALID_OPTION, f"--engine-threads must be 1..256, not {options.engine_threads}")
    return None


def _running_agent(paths: AgentPaths) -> Refused | None:
    existing = read_pid_record(paths)
    if existing is not None and verify_pid(existing) == "running" and existing.pid != os.getpid():
        return Refused(ALREADY_RUNNING, f"an agent is already running for {paths.root} (pid {existing.pid}); "
                                        "`gridctl node stop` first")
    if is_locked(paths.root):
        holder = read_holder(paths.root)
        return Refused(ALREADY_RUNNING, f"an agent is already running for {paths.root}"
                                        + (f" (pid {holder.pid})" if holder else "") + "; one agent per state directory")
    return None


def _enrolment(options: LaunchOptions, paths: AgentPaths) -> Joined | Refused | None:
    """The enrolment to run as: the one kept here, else one made with --join-token-file, else None."""
    joined = read_joined(paths)
    if joined is None and options.join_token_file is not None:
        try:
            token_text = options.join_token_file.read_text()
        except OSError as exc:
            return Refused(JOIN_REFUSED, f"cannot read the join token: {exc}")
        joined = redeem_join_token(token_text, paths)
    return joined


def prepare(options: LaunchOptions) -> Launch | Refused:
    """Check `options` and this machine, joining first if asked; nothing runs yet. Creates the
    grid home and the state directory."""
    cfg = GridConfig.from_environ()
    paths = AgentPaths.for_config(cfg, options.state_dir)
    cfg.ensure_home()
    paths.ensure()
    refused = _running_agent(paths) or _check_options(options)
    if refused is not None:
        return refused
    joined = _enrolment(options, paths)
    if isinstance(joined, Refused):
        return joined
    host_id, failure_domain, tags = options.host_id, options.failure_domain, list(options.tags)
    if joined is not None:
        # This machine joined with `gridctl node join`: run as the host its credential names.
        if host_id and host_id != joined.host_id:
            return Refused(HOST_MISMATCH, f"this machine joined as host {joined.host_id!r}, not {host_id!r}")
        host_id = joined.host_id
        if failure_domain == "default" and joined.failure_domain:
            failure_domain = joined.failure_domain
        tags = tags or list(joined.tags)
        url: str | Refused = options.nats or joined.server
    else:
        url = options.resolve_url(options.nats, cfg)
    if isinstance(url, Refused):
        return url
    ports = parse_port_range(options.port_range)
    if isinstance(ports, Refused):
        return ports
    agent_options = AgentOptions(
        host_id=host_id, capacity_mb=options.capacity_mb, reserved_mb=options.reserved_mb,
        failure_domain=failure_domain, tags=tuple(t.strip() for raw in tags for t in raw.split(",") if t.strip()),
        port_range=ports, heartbeat_interval=options.heartbeat_interval, sample_interval=options.sample_interval,
        drain_deadline=options.drain_deadline, orphan_grace=options.orphan_grace, state_dir=paths.root,
        llama_server=options.llama_server,
        policy=ProtectionPolicy(throttle_fraction=options.throttle_fraction,
                                cpu_throttle=cpu_throttle_thresholds(options.cpu_throttle),
                                user_active_seconds=yield_to_user_seconds(options.yield_to_user, joined)),
        dedicated=joined.dedicated if joined is not None else None,
        data_tier=options.data_tier, credentials=Path(joined.creds_path) if joined is not None else None,
        **({"threads": options.engine_threads} if options.engine_threads is not None else {}),
    )
    return Launch(config=cfg, paths=paths, url=url, joined=joined, agent_options=agent_options,
                  record=this_process_record())


# --- running it -------------------------------------------------------------------------------


class Reporter(Protocol):
    """Where the launch tells its operator what happened (the CLI: standard error)."""

    def error(self, message: str) -> None: ...

    def info(self, message: str) -> None: ...


class StderrReporter:
    def error(self, message: str) -> None:
        print(f"error: {message}", file=sys.stderr, flush=True)

    def info(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)


async def run_launch(launch: Launch, reporter: Reporter) -> int:
    """Connect, run the agent until SIGTERM/SIGINT, then drain and stop it; the exit code."""
    from grid.agent.credential import credential_expired, revoked_message, watch_revocation
    from grid.agent.inventory import CapacityShareError
    from grid.agent.lock import AgentLockedError
    from grid.agent.service import HostAgent, HostIdError
    from grid.events.log import LogError
    from grid.identity.connect import connect_log
    from grid.secrets import SecretFileError
    from grid.transport.jetstream import JetStreamLog

    joined, paths, record = launch.joined, launch.paths, launch.record
    try:
        if joined is not None:
            event_log = await connect_log(launch.url, credentials=Path(joined.creds_path), name="grid-agent",
                                          tls_ca=Path(joined.ca_path) if joined.ca_path else None,
                                          ensure_streams=False)
        else:
            event_log = await JetStreamLog.connect(launch.url, name="grid-agent")
    except LogError as exc:
        hint = ""
        if joined is None and "authorization" in str(exc).lower():
            hint = ("; this grid runs with auth on: join it first (`gridctl invite` on the controller's "
                    "machine, then `gridctl node join TOKEN` here)")
        elif (joined is not None and "authorization" in str(exc).lower()
              and not credential_expired(Path(joined.creds_path), time.time())):
            hint = ("; the servers refuse this host's credential although it has not expired: the operator "
                    "revoked it (`gridctl node revoke`); ask for a new invitation, then `gridctl node join TOKEN`")
        reporter.error(f"{exc}{hint}")
        return EXIT_REFUSED
    agent = HostAgent(event_log, launch.config, launch.agent_options)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.request_stop)
    # The pid file exists from the start (recovery may take a while), so `node stop` works.
    atomic_write(paths.pid_file, msgspec.json.encode(record))
    try:
        await agent.start()
    except (HostIdError, AgentLockedError, LogError, OSError, SecretFileError, CapacityShareError) as exc:
        reporter.error(str(exc))
        await agent.stop(drain=False)
        paths.pid_file.unlink(missing_ok=True)
        await event_log.close()
        return EXIT_START_FAILED
    atomic_write(paths.pid_file, msgspec.json.encode(msgspec.structs.replace(record, host_id=agent.host_id)))
    reporter.info(f"agent {agent.host_id} running (pid {record.pid}); stop with `gridctl node stop`")
    # A revoked credential is refused on every reconnect, forever: say so once and stop.
    revoked: list[float] = []
    watcher: asyncio.Task[float] | None = None
    if joined is not None and hasattr(event_log, "add_disconnect_listener"):
        watcher = asyncio.create_task(watch_revocation(
            event_log, launch.url, Path(joined.creds_path), Path(joined.ca_path) if joined.ca_path else None),
            name="agent-revocation-watch")

        def on_revoked(task: asyncio.Task[float]) -> None:
            if task.cancelled() or task.exception() is not None:
                return
            revoked.append(task.result())
            reporter.error(revoked_message(revoked[0]))
            agent.request_stop()

        watcher.add_done_callback(on_revoked)
    try:
        await agent.run_until_stopped()
    finally:
        if watcher is not None:
            await cancel_and_wait([watcher])
        if revoked:
            await event_log.close()  # nothing more reaches the grid: stop without waiting on it
        await agent.stop(drain=True)
        current = read_pid_record(paths)
        if current is not None and current.instance == record.instance:
            paths.pid_file.unlink(missing_ok=True)
        await event_log.close()
    return EXIT_REVOKED if revoked else EXIT_STOPPED


def launch(options: LaunchOptions, reporter: Reporter | None = None) -> int:
    """Prepare, then run on Grid's event loop (grid.eventloop); the process exit code."""
    reporter = reporter or StderrReporter()
    prepared = prepare(options)
    if isinstance(prepared, Refused):
        reporter.error(prepared.message)
        return EXIT_REFUSED
    try:
        return eventloop.run(run_launch(prepared, reporter))
    except eventloop.EventLoopChoiceError as exc:
        reporter.error(str(exc))
        return EXIT_START_FAILED
