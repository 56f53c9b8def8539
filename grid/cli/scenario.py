"""gridctl test scenario / gridctl test graduate: the scenario lab (grid.sim) from the shell.

A decision-quality test on a simulated clock: no process, no network, no inference. Both
commands print a table, or `--json`; `scenario` is byte-stable for a seed.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from grid.cli.common import JsonOption, err_console
from grid.sim import flapping as flapping_mod
from grid.sim import graduate as graduate_mod
from grid.sim import oracle as oracle_mod
from grid.sim.report import render, to_json
from grid.sim.run import run
from grid.sim.scenario import ScenarioConfig, prepare
from grid.sim.strategies import STRATEGIES
from grid.sim.trace import TraceError, parse_option, read_trace


# Options the lab commands share (one default and one help text each).
ModelsOption = typer.Option(8, "--models", help="Models from the lab catalog (1-9).")
UsersOption = typer.Option(50, "--users", help="Simulated users (personas in fixed proportions).")
HoursOption = typer.Option(2.0, "--hours", help="Length of the simulated workday in hours (at most 24).")


def _fail(message: str) -> None:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(2)


def _minutes(hours: float) -> int:
    if not (hours > 0) or hours * 60 > 24 * 60:
        _fail(f"--hours must be more than 0 and at most 24, got {hours}")
    return max(1, int(round(hours * 60)))


def scenario(
    machines: int = typer.Option(4, "--machines", help="Logical machines (4 is the seed's scarce fleet: 8/16/24/48 GiB)."),
    models: int = ModelsOption,
    users: int = UsersOption,
    hours: float = HoursOption,
    seed: int = typer.Option(42, "--seed", help="Seed for the day, incidents and requests (same seed, same bytes)."),
    strategy: str = typer.Option("smart", "--strategy", help="smart (production), reactive, greedy or static."),
    oracle: bool = typer.Option(False, "--oracle", help="Also run the bounded hindsight oracle (<= 4 machines, 9 models, 240 min)."),
    workload_trace: Optional[list[str]] = typer.Option(
        None, "--workload-trace", help="WORKLOAD=CSV: headerless (seconds, rate) series for one workload; repeatable."),
    timeline: bool = typer.Option(False, "--timeline", help="Include every changing tick (commands, incidents)."),
    json_out: bool = JsonOption,
) -> None:
    """Run one strategy over a simulated workday and report served demand, churn, memory and safety."""
    if strategy not in STRATEGIES:
        _fail(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    traces = []
    seen: set[str] = set()
    try:
        for option in workload_trace or []:
            workload, path = parse_option(option)
            if workload in seen:
                raise TraceError(f"--workload-trace names {workload} twice")
            seen.add(workload)
            traces.append((workload, tuple(read_trace(path))))
    except TraceError as exc:
        _fail(str(exc))
    cfg = ScenarioConfig(machines=machines, models=models, users=users, minutes=_minutes(hours), seed=seed,
                         traces=tuple(traces))
    try:
        sc = prepare(cfg)
    except ValueError as exc:
        _fail(str(exc))
    hindsight = None
    if oracle:
        why = oracle_mod.refusal(sc)
        if why is not None:
            _fail(f"{why}: the exhaustive search is bounded; drop --oracle or shrink the scenario")
    report = run(sc, strategy, timeline=timeline).report()
    if oracle:
        hindsight = oracle_mod.solve(sc)
    if json_out:
        sys.stdout.buffer.write(to_json(report, {"oracle": hindsight} if hindsight is not None else None) + b"\n")
        return
    typer.echo(render(report, hindsight))


def graduate(
    fleets: str = typer.Option("4,16", "--fleets", help="Comma-separated fleet sizes (machines)."),
    seeds: str = typer.Option("6", "--seeds", help="A count N (seeds 1..N), or explicit seeds and ranges "
                              "such as 7,42 or 3-5 (one explicit seed: 42,)."),
    days: str = typer.Option("classic,full", "--days", help="Comma-separated day shapes: classic (--hours long) "
                             "and full (8 hours with lunch, evening and long-tail named models)."),
    hours: float = typer.Option(2.0, "--hours", help="Length of the classic day in hours."),
    models: int = ModelsOption,
    users_per_machine: float = typer.Option(12.5, "--users-per-machine", help="Users per machine (4 machines: 50)."),
    flap_quarantine: bool = typer.Option(True, "--flap-quarantine/--no-flap-quarantine",
                                         help="Run the strategies with flap quarantine (the controller's "
                                              "default) or with it off, to compare the two."),
    json_out: bool = JsonOption,
) -> None:
    """Run every strategy over fleet sizes and seeds; print the gates and exit non-zero if one fails."""
    try:
        sizes = [int(x) for x in fleets.split(",") if x.strip()]
    except ValueError:
        _fail(f"--fleets must be comma-separated integers, got {fleets!r}")
    if not sizes:
        _fail("--fleets names no fleet")
    try:
        seed_values = graduate_mod.parse_seeds(seeds)
        day_shapes = graduate_mod.parse_days(days)
    except ValueError as exc:
        _fail(str(exc))
    minutes = _minutes(hours)
    results = []
    for machines in sizes:
        users = max(1, int(round(users_per_machine * machines)))
        for day in day_shapes:
            try:
                results.append(graduate_mod.run_fleet(
                    machines, seed_values, users=users, models=models,
                    minutes=graduate_mod.day_minutes(day, minutes), day=day,
                    progress=None if json_out else (lambda msg: err_console.print(f"  {msg}", style="dim")),
                    policy=None if flap_quarantine else flapping_mod.QUARANTINE_OFF,
                ))
            except ValueError as exc:
                _fail(str(exc))
    if json_out:
        import msgspec

        sys.stdout.buffer.write(msgspec.json.encode(graduate_mod.to_dict(results), order="deterministic") + b"\n")
    else:
        typer.echo(graduate_mod.render(results))
    if not graduate_mod.passed(results):
        raise typer.Exit(1)


def flapping(
    machines: int = typer.Option(8, "--machines", help="Logical machines (the largest one flaps)."),
    models: int = ModelsOption,
    users: int = UsersOption,
    hours: float = HoursOption,
    seed: int = typer.Option(1, "--seed", help="Seed for the day, incidents and requests (same seed, same bytes)."),
    down: int = typer.Option(flapping_mod.DOWN_MINUTES, "--down", help="Minutes the machine is down in each cycle."),
    up: int = typer.Option(flapping_mod.UP_MINUTES, "--up", help="Minutes the machine is up in each cycle."),
    json_out: bool = JsonOption,
) -> None:
    """Flap the largest machine over the middle half of the day; compare flap quarantine on and off."""
    if down < 1 or up < 1:
        _fail("--down and --up must be at least 1 minute")
    try:
        sc = prepare(ScenarioConfig(machines=machines, models=models, users=users, minutes=_minutes(hours),
                                    seed=seed))
        on, off = flapping_mod.compare(sc, down_minutes=down, up_minutes=up)
    except ValueError as exc:
        _fail(str(exc))
    if json_out:
        import msgspec

        sys.stdout.buffer.write(msgspec.json.encode({"quarantine_on": on, "quarantine_off": off},
                                                    order="deterministic") + b"\n")
        return
    rows = [("starts on the flapping machine", "starts_on_flapping_host"), ("replicas it lost", "replicas_lost"),
            ("flaps (restarts within 15 min)", "flaps"), ("churn", "churn"), ("served demand", "served_demand"),
            ("least-served workload", "least_workload_service"), ("safety violations", "safety_violations"),
            ("minutes quarantined", "quarantined_minutes")]
    typer.echo(f"{'':34} {'quarantine on':>14} {'quarantine off':>15}")
    for label, key in rows:
        typer.echo(f"{label:34} {getattr(on, key)!s:>14} {getattr(off, key)!s:>15}")
