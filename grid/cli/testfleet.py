"""gridctl test start | status | watch | demo | stop: the logical multi-machine fleet on this machine.

The fixture logic is grid.testfleet; this is its command line. The fleet lives under
GRID_HOME/testfleet, apart from the grid `gridctl up` runs in the same home.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.table import Table

from grid.cli.common import JsonOption, console, err_console, fail, print_json

if TYPE_CHECKING:
    from grid.testfleet.state import FleetManifest


def _root() -> Path:
    from grid.testfleet.fleet import fleet_root

    return fleet_root()


def _recorded_fleet() -> FleetManifest:
    """The fleet recorded under this home; a clear error, exit 1, when there is
    none or its state file is damaged."""
    from grid.testfleet.fleet import FleetStateError
    from grid.testfleet.state import load_state

    root = _root()
    try:
        state = load_state(root)
    except FleetStateError as exc:
        fail(str(exc))
        raise AssertionError from exc
    if state is None:
        fail(f"no test fleet in {root} (`gridctl test start`)")
        raise AssertionError
    return state


def _capacities(value: str | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        caps = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        fail(f"--capacities-gib takes numbers separated by commas (2,3,4), not {value!r}")
        raise
    if not caps or any(c <= 0 for c in caps):
        fail(f"--capacities-gib takes positive numbers of GiB separated by commas (2,3,4), not {value!r}")
    return caps


def _say(text: str) -> None:
    err_console.print(f"[dim]{text}[/dim]", highlight=False)


def start(
    machines: int = typer.Option(3, "--machines", "-n", help="Number of logical machines (1-32)."),
    model: Optional[Path] = typer.Option(
        None, "--model", help="A GGUF file to serve (default: the bundled SmolLM2, pulled if needed)."),
    capacities_gib: Optional[str] = typer.Option(
        None, "--capacities-gib",
        help="Memory each machine offers, GiB, one per machine (2,3,4). Default: 2 GiB each, less if the "
             "machine has less; they never add up to more than this machine has."),
    use_netns: bool = typer.Option(
        False, "--netns/--no-netns",
        help="Put every machine in its own network namespace on a bridge (10.213.0.0/24; needs root). "
             "Without it everything runs on loopback."),
    preload_hosts: Optional[int] = typer.Option(
        None, "--preload-hosts",
        help="How many machines (the first N) have the model in their artifact cache at start; the others "
             "must get it from the grid. Default: all."),
    engine_port_base: int = typer.Option(41000, "--engine-port-base",
                                         help="Engine ports: machine i uses BASE+20*i to BASE+20*i+19."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the model is READY on a machine."),
    json_out: bool = JsonOption,
) -> None:
    """Start a fleet of logical machines: NATS, a controller, a gateway and N real agents."""
    from grid.testfleet.fleet import FleetError, FleetSpec, FleetStateError, fleet_status, start_fleet
    from grid.testfleet.netns import NetnsError

    spec = FleetSpec(machines=machines, model=model, capacities_gib=_capacities(capacities_gib), netns=use_netns,
                     preload_hosts=preload_hosts, engine_port_base=engine_port_base, wait=wait)
    root = _root()
    try:
        start_fleet(root, spec, say=_say)
        status = fleet_status(root)
    except (FleetError, FleetStateError, NetnsError) as exc:
        fail(str(exc))
        raise AssertionError from exc
    assert status is not None
    if json_out:
        print_json(status)
        return
    console.print(f"[bold]test fleet is up[/bold] ({len(status['hosts'])} machines, state {root / 'fleet.json'})")
    console.print(f"  gateway         {status['gateway_url']}/v1   (OpenAI-compatible)", highlight=False)
    console.print(f"  admin API       {status['admin_url']}/allocator/status", highlight=False)
    console.print(f"  operator token  {status['operator_token_file']}  (owner-only)", highlight=False)
    console.print(f"  NATS            {status['nats_url']}", highlight=False)
    console.print(f"try: gridctl chat --gateway {status['gateway_url']} -m {status['settings']['model_id']} \"hello\"",
                  style="dim", highlight=False)
    console.print("gridctl test status | watch | stop", style="dim")


def status(json_out: bool = JsonOption) -> None:
    """Show the fleet: its processes, and each machine as the controller sees it."""
    from grid.testfleet.fleet import FleetStateError, fleet_status

    root = _root()
    try:
        status = fleet_status(root)
    except FleetStateError as exc:
        fail(str(exc))
        raise AssertionError from exc
    if status is None:
        if json_out:
            print_json({"root": str(root), "running": False})
        else:
            console.print(f"no test fleet in {root} (`gridctl test start`)")
        return
    if json_out:
        print_json(status)
        return
    console.print(f"test fleet {root}  gateway {status['gateway_url']}/v1  admin {status['admin_url']}",
                  highlight=False)
    down = [name for name, p in status["processes"].items() if not p["running"]]
    if down:
        console.print(f"[yellow]not running: {', '.join(down)}[/yellow]")
    if status["controller_problem"]:
        console.print(f"[yellow]{status['controller_problem']}[/yellow]")
    table = Table("machine", "domain", "MB", "address", "agent", "heartbeat", "state", "residencies")
    for h in status["hosts"]:
        table.add_row(h["host_id"], h["failure_domain"], str(h["capacity_mb"]), h["address"] or "loopback",
                      f"pid {h['agent_pid']}" if h["agent_running"] else "[red]down[/red]",
                      "fresh" if h["fresh"] else "[yellow]stale[/yellow]", h["state"] or "-",
                      ", ".join(f"{r['model_id']}={r['state']}" for r in h["residencies"]) or "-")
    console.print(table)


def watch() -> None:
    """Follow residency transitions and command outcomes until Ctrl-C (the fleet keeps running)."""
    from grid.events.log import LogError
    from grid.testfleet.watch import Line, follow

    state = _recorded_fleet()

    def emit(line: Line) -> None:
        when = dt.datetime.fromtimestamp(line.at, dt.timezone.utc).strftime("%H:%M:%S")
        style = {"residency": "cyan", "command": "", "outcome": "green", "withdrawn": "yellow"}[line.kind]
        if line.kind == "outcome" and " failed" in line.text:
            style = "red"
        console.print(f"{when} {line.text}", style=style or None, highlight=False)

    console.print("following residency transitions and command outcomes (Ctrl-C stops watching; the fleet "
                  "keeps running)", style="dim")
    try:
        asyncio.run(follow(state.nats_url, Path(state.control_home), emit))
    except KeyboardInterrupt:
        pass
    except LogError as exc:
        fail(f"cannot follow the fleet's log: {exc}")


def stop() -> None:
    """Stop every process of the fleet and remove its network namespaces and bridge."""
    from grid.testfleet.fleet import FleetStateError, stop_fleet
    from grid.testfleet.state import load_state

    root = _root()
    try:
        if load_state(root) is None:
            console.print(f"no test fleet in {root}")
            return
        problems = stop_fleet(root, say=_say)
    except FleetStateError as exc:
        fail(str(exc))
        raise AssertionError from exc
    if problems:
        fail("the fleet did not stop cleanly (its state file is kept; run `gridctl test stop` again):\n  "
             + "\n  ".join(problems))
    console.print("test fleet stopped")


def demo(
    users: int = typer.Option(3, "--users", min=1, max=64,
                              help="Client personas sending concurrent requests (each with its own affinity key); "
                                   "at least three distinct users send the unresolved coding requests."),
    requests: int = typer.Option(12, "--requests", min=2, max=1000,
                                 help="Requests the personas send in all, alternating between the two models."),
    max_tokens: int = typer.Option(16, "--max-tokens", min=1, max=4096, help="max_tokens of every request."),
    coding_model: Optional[Path] = typer.Option(
        None, "--model",
        help="A GGUF to serve as the coding model (stored in the grid's artifact store; the hosts fetch it). "
             "Default: a second profile of the fleet's own model standing in for a coding model."),
    workload_models: Optional[list[str]] = typer.Option(
        None, "--workload-model",
        help="WORKLOAD=MODEL, repeatable: run the adaptive workday instead of the coding flow, with coding, "
             "research, marketing and sales bound (coding to a specialist, the other three to one shared model). "
             "MODEL is a GGUF file (stored in the grid's artifact store) or a name for another profile of the "
             "fleet's own model. Needs two hosts larger than the rest (start with --capacities-gib 1,2,2)."),
    bucket_seconds: float = typer.Option(
        4.0, "--bucket-seconds", min=1.0, max=3600.0,
        help="Workday only: the demand bucket it sets (gridctl forecast-window); the forecast's evidence gate "
             "is 15 buckets, so 4 s makes a workday of a few minutes."),
    converge_timeout: float = typer.Option(
        1200.0, "--converge-timeout", min=1.0,
        help="Seconds to wait for the fleet to be idle first (one baseline replica, no coding model); a "
             "previous run's demand keeps the coding model for up to the forecast window, about 16 minutes."),
    json_out: bool = JsonOption,
) -> None:
    """Run the focused coding flow (or, with --workload-model, the adaptive workday) on the running fleet with
    real requests only; exit 1 on any failed requirement."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from grid.testfleet.demo import DemoSpec, run_demo
    from grid.testfleet.fleet import FleetError
    from grid.testfleet.workday import WorkdaySpec, parse_bindings, run_workday

    state = _recorded_fleet()
    out = err_console if json_out else console
    bar = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=out, transient=True)
    tasks: dict[str, object] = {}

    def progress(what: str, elapsed: float, timeout: float) -> None:
        if what not in tasks:
            tasks[what] = bar.add_task(f"waiting: {what}", total=timeout)
        bar.update(tasks[what], completed=min(elapsed, timeout))  # type: ignore[arg-type]
        if elapsed >= timeout:
            bar.remove_task(tasks[what])  # type: ignore[arg-type]

    def on_line(line: object) -> None:
        when = dt.datetime.fromtimestamp(line.at, dt.timezone.utc).strftime("%H:%M:%S")  # type: ignore[attr-defined]
        style = {"residency": "cyan", "command": None, "outcome": "green", "withdrawn": "yellow"}[line.kind]  # type: ignore[attr-defined]
        out.print(f"{when} {line.text}", style=style, highlight=False)  # type: ignore[attr-defined]

    say = lambda text: out.print(text, style="bold", highlight=False)  # noqa: E731
    try:
        if workload_models:
            if coding_model is not None:
                raise FleetError("--model names the focused flow's coding model; the workday binds its models with "
                                 "--workload-model coding=MODEL")
            wspec = WorkdaySpec(bindings=parse_bindings(workload_models), max_tokens=max_tokens, users=users,
                                bucket_seconds=bucket_seconds, converge_timeout=converge_timeout)
            with bar:
                report = run_workday(state, wspec, say=say, progress=progress, on_line=on_line)
        else:
            spec = DemoSpec(users=users, requests=requests, max_tokens=max_tokens, coding_model=coding_model,
                            converge_timeout=converge_timeout)
            with bar:
                report = run_demo(state, spec, say=say, progress=progress, on_line=on_line)
    except FleetError as exc:
        fail(str(exc))
        raise AssertionError from exc
    if json_out:
        print_json(report.to_json())
    else:
        _print_demo(report)
    if not report.passed:
        raise typer.Exit(1)


def _print_demo(report: object) -> None:
    from grid.testfleet.demo import DemoReport

    assert isinstance(report, DemoReport)
    answers = Table("persona", "model", "host", "status", "tries", "ms", "id", "tokens")
    for a in report.answers:
        answers.add_row(a.persona, a.model, a.host_id or "-", str(a.status) + ("" if a.ok or a.status != 200 else " (incomplete)"),
                        str(a.attempts), f"{a.latency_ms:.0f}", a.response_id or (a.reason or "-"),
                        f"{a.prompt_tokens}+{a.completion_tokens}" if a.completion_tokens is not None else "-")
    console.print(answers)
    perf = Table("host", "model", "samples", "p50 ms", "max ms", "tok/s", title="per-host performance (client-measured)")
    for host, row in report.performance().items():
        for model, v in row.items():
            perf.add_row(host, model, str(v["samples"]), str(v["p50_latency_ms"]), str(v["max_latency_ms"]),
                         str(v["tokens_per_second"]))
    console.print(perf)
    for phase in report.phases:
        console.print(f"  phase {phase['name']}: {phase['answered']} of {phase['sent']} answered "
                      f"({phase['retried']} retried), {phase['finished_at'] - phase['started_at']:.0f} s",
                      highlight=False)
    console.print("[bold]lifecycle per residency[/bold]")
    for key, steps in report.lifecycles().items():
        path = " -> ".join([steps[0]["from"], *(s["to"] for s in steps)])
        console.print(f"  {key}: {path}", highlight=False)
    for model, c in report.counts().items():
        console.print(f"  {model}: {c['answered']} answered, {c['refused']} refused of {c['sent']} "
                      f"({c['retried']} retried)", highlight=False)
    for req in report.requirements:
        mark = "[green]pass[/green]" if req["ok"] else "[red]FAIL[/red]"
        console.print(f"{mark} {req['name']}: {req['detail']}", highlight=False)
    console.print("[bold green]demo passed[/bold green]" if report.passed else "[bold red]demo failed[/bold red]")


def register(app: typer.Typer) -> None:
    app.command("start")(start)
    app.command("status")(status)
    app.command("watch")(watch)
    app.command("demo")(demo)
    app.command("stop")(stop)
