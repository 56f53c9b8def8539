"""The controller process: one typer command, `gridctl serve controller`.

It lives with the CLI (the CLI depends on the controller, never the reverse) and is the only
way to start a controller process; there is no second parser.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Optional

import typer

from grid import eventloop
from grid.cli.common import LogFormatOption, err_console, fail, resolve_nats_url
from grid.config import ConfigError, GridConfig, parse_replicas
from grid.controller.api import serve_admin
from grid.controller.governor import Limits
from grid.controller.service import Controller, ControllerError, ControllerSettings
from grid.events.log import LogError
from grid.localgrid import durability_note
from grid.logs import configure_logging
from grid.secrets import SecretFileError
from grid.transport.jetstream import REPLICAS_MISMATCH

DEFAULT_ADMIN_PORT = 8787
_DEFAULT_SETTINGS = ControllerSettings()
_DEFAULT_LIMITS = Limits()


def serve_controller(
    nats: Optional[str] = typer.Option(
        None, "--nats", envvar="GRID_NATS_URL",
        help="NATS URL of the grid (default: the URL a local `gridctl up` recorded in the grid home)."),
    home: Optional[Path] = typer.Option(None, "--home", help="Grid home (default GRID_HOME or ~/.grid)."),
    admin_host: str = typer.Option("127.0.0.1", "--admin-host", "--host", help="Admin API listen address."),
    admin_port: int = typer.Option(DEFAULT_ADMIN_PORT, "--admin-port", "--port",
                                   help="Admin API port; 0 picks a free one (the URL is written to GRID_HOME/admin.url)."),
    no_admin: bool = typer.Option(False, "--no-admin", help="Do not serve the admin API."),
    trusted_proxy: list[str] = typer.Option(
        [], "--admin-trusted-proxy",
        help="Address of a reverse proxy whose X-Forwarded-For the admin API believes (repeat); none by default."),
    tick_interval: float = typer.Option(_DEFAULT_SETTINGS.tick_interval_seconds, "--tick-interval",
                                        help="Seconds between periodic ticks (changes tick sooner)."),
    lease_ttl: float = typer.Option(_DEFAULT_SETTINGS.lease_ttl_seconds, "--lease-ttl",
                                    help="Controller lease time-to-live in seconds."),
    lease_renew: float = typer.Option(_DEFAULT_SETTINGS.lease_renew_seconds, "--lease-renew",
                                      help="Seconds between lease renewals."),
    restart_grace: float = typer.Option(_DEFAULT_SETTINGS.restart_grace_seconds, "--restart-grace",
                                        help="Seconds after the first tick before destructive work is allowed."),
    max_mutations: int = typer.Option(_DEFAULT_LIMITS.max_global_mutations, "--max-mutations",
                                      help="Global concurrent mutation limit."),
    max_host_mutations: int = typer.Option(_DEFAULT_LIMITS.max_host_mutations, "--max-host-mutations",
                                           help="Per-host concurrent mutation limit."),
    artifact_fanout: int = typer.Option(_DEFAULT_LIMITS.artifact_fanout, "--artifact-fanout",
                                        help="Concurrent loads of one exact artifact."),
    assume_durable: bool = typer.Option(
        False, "--assume-durable",
        help="Treat the NATS server as durable (it fsyncs every write) when it does not report its sync "
             "policy; automatic mode is refused otherwise."),
    analytics: bool = typer.Option(
        True, "--analytics/--no-analytics",
        help="Run the DuckDB analytics sink in this process (GRID_HOME/analytics.duckdb) and serve "
             "`gridctl history` from it."),
    replicas: Optional[str] = typer.Option(
        None, "--replicas", envvar="GRID_REPLICAS", metavar="1..5",
        help="Replicas of every stream and the lease bucket (default: 1 on a single NATS server, 3 on a "
             "cluster of three or more). Existing streams are updated to it where NATS allows."),
    log_format: str = LogFormatOption,
    publish_pause: float = typer.Option(0.0, "--publish-pause", hidden=True,
                                        help="Test seam: pause between command publishes."),
) -> None:
    """Run the controller (and its admin API) in the foreground until SIGINT/SIGTERM."""
    configure_logging(log_format)
    try:
        wanted_replicas = parse_replicas(replicas, source="--replicas / GRID_REPLICAS")
    except ConfigError as exc:
        fail(str(exc))
    cfg = GridConfig.from_environ()
    if home is not None:
        cfg = GridConfig(home=home.expanduser(), nats_url=cfg.nats_url)
    url = resolve_nats_url(nats, cfg)
    settings = ControllerSettings(
        tick_interval_seconds=tick_interval, lease_ttl_seconds=lease_ttl, lease_renew_seconds=lease_renew,
        restart_grace_seconds=restart_grace, publish_pause_seconds=publish_pause, analytics=analytics,
        limits=Limits(max_global_mutations=max_mutations, max_host_mutations=max_host_mutations,
                      artifact_fanout=artifact_fanout),
    )
    try:
        eventloop.run(_run(GridConfig(home=cfg.home, nats_url=url), settings, None if no_admin else (admin_host, admin_port),
                           assume_durable, tuple(trusted_proxy), wanted_replicas))
    except (LogError, ControllerError, SecretFileError, eventloop.EventLoopChoiceError) as exc:  # no log, another controller holds this home, a bad token
        fail(str(exc))


async def _run(cfg: GridConfig, settings: ControllerSettings, admin: tuple[str, int] | None,
               assume_durable: bool, trusted_proxies: tuple[str, ...] = (), replicas: int | None = None) -> None:
    from grid.identity.connect import connect_log
    from grid.identity.local import authority_dir, local_credential, local_tls_ca
    from grid.identity.service import ControllerIdentity

    assert cfg.nats_url is not None
    # With auth on (`gridctl nats init` made the authority under this home) the controller
    # connects as itself, provisions host consumers and serves enrolment.
    creds = local_credential(cfg.home, "controller")
    ca = local_tls_ca(cfg.home) if creds is not None else None
    log_ = await connect_log(cfg.nats_url, credentials=creds, tls_ca=ca, name="grid-controller", durable=False,
                             replicas=replicas)
    # A stream the server would not re-replicate is never silently left: say it, with the fix.
    mismatches = [r for r in log_.replica_reports if r.outcome == REPLICAS_MISMATCH]
    for r in mismatches:
        err_console.print(f"[yellow]stream {r.stream} has {r.actual} replica(s), not {r.wanted} "
                          f"({r.error}); fix: {r.fix}[/yellow]", highlight=False)
    identity = (ControllerIdentity(authority_dir(cfg.home), ca_pem=ca.read_text() if ca else None)
                if creds is not None else None)
    # An external server counts as durable only when it says it fsyncs every write (or the
    # operator vouches for it); otherwise automatic mode is refused and the controller recommends.
    # A server whose config `gridctl nats init` / `nats cluster-config` wrote under this home is
    # recorded there (grid.identity.durability) and counts as durable too.
    from grid.identity.durability import external_log_durable

    reported: bool | None = None
    if assume_durable:
        log_.durable = True
    else:
        log_.durable, reported, _recorded = await external_log_durable(log_, cfg.home)
    if not log_.durable:
        err_console.print(f"[yellow]{durability_note(reported)}; automatic mode is refused (the controller only "
                          "recommends). If its JetStream fsyncs every write (sync_interval: always), restart with "
                          "--assume-durable.[/yellow]")
    controller = Controller(log_, cfg, settings=settings, identity=identity)
    controller.warnings.extend(f"stream {r.stream} has {r.actual} replica(s), not {r.wanted}: {r.fix}"
                               for r in mismatches)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await controller.start()
    except BaseException:
        await log_.close()
        raise
    server = None
    try:
        if admin is not None:
            server = await serve_admin(controller, *admin, trusted_proxies=trusted_proxies)
            print(f"admin API {server.url}", flush=True)
        print(f"controller {controller.controller_id} started", flush=True)
        await stop.wait()
    finally:
        if server is not None:
            await server.stop()
        await controller.stop()
        await log_.close()

