"""gridctl engine add | rm | ls | discover: register engines Grid did not start, on the host where
they run.

The registration is stored in this host's agent state directory (owner-only); the running agent
re-reads it every probe round, so no restart is needed. Grid serves a registered engine and
counts it as capacity, and never starts, stops, signals, loads, warms or drains it. `discover`
only proposes registrations: nothing is registered unless the operator runs `add`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from grid.agent import external
from grid.agent.state import AgentPaths
from grid.config import GridConfig

engine_app = typer.Typer(
    help="Register engines Grid did not start (llama-server, vLLM, Ollama, LM Studio, any OpenAI-compatible "
         "endpoint) so this host's agent serves them. Grid never starts, stops or signals them.",
    no_args_is_help=True,
)

StateDirOption = typer.Option(
    None, "--state-dir", envvar="GRID_AGENT_STATE_DIR",
    help="This host's agent state directory, where registrations are kept (default: GRID_HOME/agent).",
)

KIND_HELP = (
    "What the endpoint is: " + ", ".join(external.KINDS) + ". It selects only the probe endpoints "
    "(/v1/models for every kind, plus /health for llama.cpp); Grid does not run or manage vLLM, Ollama "
    "or LM Studio, it only routes to an instance already running."
)


def _state_dir(state_dir: Path | None) -> Path:
    return AgentPaths.for_config(GridConfig.from_environ(), state_dir).root


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


@engine_app.command("add")
def add(
    url: str = typer.Argument(..., help="The engine's base URL, e.g. http://127.0.0.1:8080 (a trailing /v1 is "
                                        "accepted). It is reported in heartbeats: it must carry no credentials."),
    model: str = typer.Option(..., "--model", help="The model id the endpoint lists in /v1/models; requests for "
                                                   "this id are routed to it."),
    kind: str = typer.Option(..., "--kind", help=KIND_HELP),
    memory_mb: int = typer.Option(0, "--memory-mb", help="Memory the engine holds on this host, counted as use "
                                                         "outside Grid (0: not declared)."),
    api_key_file: Optional[Path] = typer.Option(
        None, "--api-key-file", help="An owner-only file holding the endpoint's API key. The key stays on this "
                                     "host: it is read by the agent when probing and forwarding, never logged or "
                                     "put in an event."),
    state_dir: Optional[Path] = StateDirOption,
) -> None:
    """Register an engine after probing it: a wrong API key or a model the endpoint does not list is refused."""
    reg = external.validate(model, url, kind, memory_mb, api_key_file)
    if isinstance(reg, external.Refused):
        _fail(reg.message)
        return
    result = external.probe_sync(reg)
    if not result.ok:
        _fail(f"{reg.url} refused as an engine for {model!r} ({result.reason}): {result.detail}")
    root = _state_dir(state_dir)
    engines = external.with_registration(external.load(root), reg)
    external.save(root, engines)
    typer.echo(f"registered {model} at {reg.url} ({kind}); this host's agent serves it within "
               f"{external.PROBE_INTERVAL_SECONDS:g}s and never starts, stops or signals it")


@engine_app.command("rm")
def rm(
    target: str = typer.Argument(..., help="The model id or the URL of a registered engine."),
    state_dir: Optional[Path] = StateDirOption,
) -> None:
    """Stop routing to a registered engine (the engine itself is left running)."""
    root = _state_dir(state_dir)
    kept, removed = external.without(external.load(root), target)
    if not removed:
        _fail(f"no engine registered as {target!r} ({external.REG_NOT_FOUND})")
    external.save(root, kept)
    for e in removed:
        typer.echo(f"removed {e.model_id} at {e.url}; the engine keeps running")


@engine_app.command("ls")
def ls(
    as_json: bool = typer.Option(False, "--json", help="Print the registrations and their probe results as JSON."),
    probe: bool = typer.Option(True, "--probe/--no-probe", help="Probe each engine now and show the result."),
    state_dir: Optional[Path] = StateDirOption,
) -> None:
    """The engines registered on this host, and whether each answers now."""
    rows = []
    for e in external.load(_state_dir(state_dir)):
        result = external.probe_sync(e, timeout=2.0) if probe else None
        rows.append({
            "model_id": e.model_id, "url": e.url, "kind": e.kind, "memory_mb": e.memory_mb,
            "api_key_file": e.api_key_file, "probe": None if result is None else result.reason,
            "detail": None if result is None else result.detail,
        })
    if as_json:
        typer.echo(json.dumps({"engines": rows}, indent=2))
        return
    if not rows:
        typer.echo("no external engines registered on this host")
        return
    table = Table("model", "url", "kind", "memory MB", "key file", "probe")
    for r in rows:
        table.add_row(r["model_id"], r["url"], r["kind"], str(r["memory_mb"]), r["api_key_file"] or "-",
                      r["probe"] or "-" if not r["detail"] else f"{r['probe']}: {r['detail']}")
    Console(width=200).print(table)


def _ports(values: list[str]) -> dict[int, str] | str:
    """--port PORT[:KIND] values as port -> kind (the kind defaults to openai)."""
    out: dict[int, str] = {}
    for value in values:
        port, _, kind = value.partition(":")
        kind = kind or external.KIND_OPENAI
        if not port.isdigit() or not 0 < int(port) < 65536 or kind not in external.KINDS:
            return f"--port takes PORT or PORT:KIND (KIND one of {', '.join(external.KINDS)}), not {value!r}"
        out[int(port)] = kind
    return out


@engine_app.command("discover")
def discover(
    port: list[str] = typer.Option(
        [], "--port", help="Probe this loopback port instead of the well-known ones (8080 llama.cpp, 8000 vLLM, "
                           "11434 Ollama, 1234 LM Studio); PORT or PORT:KIND, repeatable."),
    as_json: bool = typer.Option(False, "--json", help="Print the proposals as JSON."),
    state_dir: Optional[Path] = StateDirOption,
) -> None:
    """Look for engines on this machine's loopback and propose registrations; nothing is registered."""
    ports = _ports(port) if port else dict(external.WELL_KNOWN_PORTS)
    if isinstance(ports, str):
        _fail(ports)
        return
    found = external.discover(ports, external.load(_state_dir(state_dir)))
    rows = []
    for p in found:
        new = [m for m in p.models if m not in p.registered]
        commands = [f"gridctl engine add {p.url} --model {m} --kind {p.kind}" for m in new]
        if p.reason == external.PROBE_KEY_REFUSED:
            commands = [f"gridctl engine add {p.url} --model MODEL --kind {p.kind} --api-key-file KEY_FILE"]
        rows.append({"url": p.url, "kind": p.kind, "probe": p.reason, "models": list(p.models),
                     "registered": list(p.registered), "propose": commands})
    if as_json:
        typer.echo(json.dumps({"engines": rows}, indent=2))
        return
    if not rows:
        typer.echo("no OpenAI-compatible engine answers on the probed loopback ports")
        return
    for r in rows:
        shown = ", ".join(r["models"]) or ("wants an API key" if r["probe"] == external.PROBE_KEY_REFUSED else "none")
        typer.echo(f"{r['url']} ({r['kind']}): {shown}")
        for command in r["propose"]:
            typer.echo(f"  {command}")
