"""gridctl engine add | rm | ls | discover: register engines Grid did not start, on the host where
they run; gridctl engine admit | revoke | routes: the operator's admission of such an engine as a
route.

The registration is stored in this host's agent state directory (owner-only); the running agent
re-reads it every probe round, so no restart is needed. Grid never starts, stops, signals, loads,
warms or drains a registered engine. `discover` only proposes registrations: nothing is
registered unless someone runs `add`.

A registration is only a request. The engine is routed, counted as capacity and taken as proof
of a replacement only once an operator admitted it: a signed `RouteAdmitted` on the control
stream naming the host, the model, the kind and the endpoint's fingerprint (sha256 of the
normalised base URL, grid.projections.routes.url_fingerprint), appended by `engine admit` with
the operator's credential. A host's credential may not write the control stream, so `engine add`
on a machine that holds only a host credential prints the operator's command instead; on the
one-machine grid of `gridctl up`, whose home holds the operator credential, `engine add`
appends the admission itself (and says so), unless `--request-only`.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Optional

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from grid.agent import external
from grid.agent.identity import stored_host_id
from grid.agent.state import AgentPaths
from grid.config import GridConfig, NatsUrlNotFound, resolve_nats_url
from grid.events.base import new_event_id
from grid.events.control import RouteAdmitted, RouteWithdrawn, model_id_error
from grid.events.log import LogError
from grid.projections import fleet as fleet_proj
from grid.projections import routes as routes_proj
from grid.projections.runner import CATALOG, FLEET, ProjectionRunner

engine_app = typer.Typer(
    help="Register engines Grid did not start (llama-server, vLLM, Ollama, LM Studio, any OpenAI-compatible "
         "endpoint) on the host where they run, and admit them as routes (operator only): Grid routes to one only "
         "once an operator admitted it. Grid never starts, stops or signals them.",
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
    request_only: bool = typer.Option(
        False, "--request-only", help="Only print the operator's `gridctl engine admit` command, even where this "
                                      "grid home holds the operator credential (the one-machine grid)."),
    nats: Optional[str] = typer.Option(
        None, "--nats", envvar="GRID_NATS_URL", help="NATS URL of the grid the admission is appended to, where this "
                                                     "grid home holds the operator credential (default: the local "
                                                     "`gridctl up`)."),
) -> None:
    """Register an engine after probing it (a wrong API key or a model the endpoint does not list is refused) and
    request its admission as a route: only an operator's admission makes Grid route to it."""
    reg = external.validate(model, url, kind, memory_mb, api_key_file)
    if isinstance(reg, external.RegistrationRefused):
        _fail(reg.message)
        return
    result = external.probe_sync(reg)
    if not result.ok:
        _fail(f"{reg.url} refused as an engine for {model!r} ({result.reason}): {result.detail}")
    root = _state_dir(state_dir)
    engines = external.with_registration(external.load(root), reg)
    external.save(root, engines)
    typer.echo(f"registered {model} at {reg.url} ({kind}); this host's agent reports it within "
               f"{external.PROBE_INTERVAL_SECONDS:g}s and never starts, stops or signals it")
    host_id = stored_host_id(AgentPaths(root)) or "HOST"
    fingerprint = routes_proj.url_fingerprint(reg.url)
    command = f"gridctl engine admit {host_id} {model} --kind {kind} --url-fingerprint {fingerprint}"
    cfg = GridConfig.from_environ()
    operator = _operator_credential(cfg)
    if request_only or operator is None or host_id == "HOST":
        typer.echo("it takes no traffic until an operator admits it as a route; the operator runs:\n  " + command)
        return
    try:
        url = resolve_nats_url(nats, cfg)
    except NatsUrlNotFound:
        typer.echo("it takes no traffic until an operator admits it as a route (no running grid found here); "
                   "the operator runs:\n  " + command)
        return
    outcome = _run(_admit(url, host_id, model, kind, fingerprint, "registered with gridctl engine add"))
    if outcome["admitted"]:
        typer.echo(f"admitted as a route with this grid home's operator credential (the one-machine grid: you are "
                   f"its operator): {host_id} {model} ({kind}, endpoint {fingerprint[:12]}), log seq {outcome['seq']}")
    else:
        _fail(f"registered, but not admitted as a route ({outcome['reason']}): {outcome['detail']}")


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


# --- the operator's admission of external routes -------------------------------------------------

# Why `engine admit` refused (beside the profile constraints of grid.projections.routes).
ADMIT_BAD_KIND = external.REG_BAD_KIND
ADMIT_BAD_FINGERPRINT = "bad_url_fingerprint"
ADMIT_BAD_MODEL = "bad_model_id"
ADMIT_NOT_OPERATOR = "not_operator"
ADMIT_LOG_ERROR = "log_error"
REVOKE_NOT_ADMITTED = "not_admitted"


def _operator_credential(cfg: GridConfig) -> Path | None:
    from grid.identity.local import local_credential

    return local_credential(cfg.home, "operator")


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _operator_log(url: str) -> Any:
    """The log as this grid home's operator identity. A home without an operator credential
    connects without one: a secured grid refuses it (a host's credential is never used here), a
    development server without identities takes the append unsigned."""
    from grid.identity.connect import connect_log
    from grid.identity.local import local_tls_ca

    cfg = GridConfig.from_environ()
    credentials = _operator_credential(cfg)
    return await connect_log(url, credentials=credentials, name="gridctl-engine",
                             tls_ca=local_tls_ca(cfg.home) if credentials is not None else None,
                             ensure_streams=credentials is None)


async def _fold(log: Any) -> ProjectionRunner:
    runner = ProjectionRunner((CATALOG, FLEET))
    await runner.catch_up(log)
    return runner


def _refusal(reason: str, detail: str) -> dict[str, Any]:
    return {"admitted": False, "reason": reason, "detail": detail}


async def _admit(url: str, host_id: str, model_id: str, kind: str, fingerprint: str, reason: str) -> dict[str, Any]:
    """Append the signed admission, unless the profile forbids the host (a value with a reason)."""
    if kind not in external.KINDS:
        return _refusal(ADMIT_BAD_KIND, f"--kind must be one of {', '.join(external.KINDS)}, not {kind!r}")
    if model_id_error(model_id) is not None:
        return _refusal(ADMIT_BAD_MODEL, str(model_id_error(model_id)))
    fingerprint = fingerprint.strip().lower()
    if len(fingerprint) != 64 or any(c not in "0123456789abcdef" for c in fingerprint):
        return _refusal(ADMIT_BAD_FINGERPRINT, "--url-fingerprint is the 64 hex digits `gridctl engine add` printed "
                                               "(sha256 of the engine's normalised base URL)")
    try:
        log = await _operator_log(url)
    except Exception as exc:  # noqa: BLE001 - reported as the command's outcome
        return _refusal(ADMIT_NOT_OPERATOR, f"cannot reach the log as an operator ({type(exc).__name__}: {exc})")
    try:
        runner = await _fold(log)
        profile = runner["catalog"].profiles.get(model_id)
        host = runner["fleet"].hosts.get(host_id)
        view = None
        if host is not None:
            view = next((h for h in fleet_proj.snapshots(runner["fleet"], time.time()) if h.host_id == host_id), None)
        why = routes_proj.profile_refusal(profile, host_id, view)
        if why is not None:
            return _refusal(why, f"the profile of {model_id} forbids host {host_id} ({why}); nothing was appended")
        result = await log.append(RouteAdmitted(event_id=new_event_id(), at=time.time(), host_id=host_id,
                                                model_id=model_id, kind=kind, url_fingerprint=fingerprint,
                                                reason=reason))
    except (LogError, msgspec.ValidationError) as exc:
        return _refusal(ADMIT_LOG_ERROR, f"{type(exc).__name__}: {exc}")
    finally:
        await log.close()
    return {"admitted": True, "reason": "", "detail": "", "host_id": host_id, "model_id": model_id, "kind": kind,
            "url_fingerprint": fingerprint, "stream": result.stream, "seq": result.seq}


def _nats_url(nats: str | None) -> str:
    try:
        return resolve_nats_url(nats, GridConfig.from_environ())
    except NatsUrlNotFound as exc:
        _fail(f"no grid found: pass --nats URL / set GRID_NATS_URL ({exc})")
        raise AssertionError from exc


NatsOption = typer.Option(None, "--nats", envvar="GRID_NATS_URL",
                          help="NATS URL of the grid (default: the local `gridctl up`).")


@engine_app.command("admit")
def admit(
    host_id: str = typer.Argument(..., help="The host whose registered engine is admitted (its stable host id)."),
    model: str = typer.Argument(..., help="The model id the engine serves there."),
    kind: str = typer.Option(..., "--kind",
                             help="The engine's kind, as registered: " + ", ".join(external.KINDS) + "."),
    url_fingerprint: Optional[str] = typer.Option(
        None, "--url-fingerprint", help="sha256 hex of the engine's normalised base URL, as `gridctl engine add` "
                                        "printed it on the host (the URL itself is not needed)."),
    url: Optional[str] = typer.Option(
        None, "--url", help="The engine's base URL instead of its fingerprint (the fingerprint is computed here; "
                            "the URL is not put in the event)."),
    reason: str = typer.Option("", "--reason", help="Why the route is admitted (kept in the event; no secrets)."),
    nats: Optional[str] = NatsOption,
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Admit a host's external engine as a route for a model: append a RouteAdmitted signed with this grid home's
    operator credential. Refused (nothing appended) when the model's profile forbids the host."""
    if (url is None) == (url_fingerprint is None):
        _fail("give exactly one of --url-fingerprint or --url")
    fingerprint = url_fingerprint if url_fingerprint is not None else routes_proj.url_fingerprint(url or "")
    outcome = _run(_admit(_nats_url(nats), host_id, model, kind, fingerprint, reason))
    if as_json:
        typer.echo(json.dumps(outcome, indent=2))
        if not outcome["admitted"]:
            raise typer.Exit(1)
        return
    if not outcome["admitted"]:
        _fail(f"refused ({outcome['reason']}): {outcome['detail']}")
    typer.echo(f"admitted {model} on {host_id} ({kind}, endpoint {outcome['url_fingerprint'][:12]}) as a route, "
               f"log seq {outcome['seq']}")


async def _revoke(url: str, host_id: str, model_id: str, reason: str) -> dict[str, Any]:
    try:
        log = await _operator_log(url)
    except Exception as exc:  # noqa: BLE001 - reported as the command's outcome
        return {"withdrawn": False, "reason": ADMIT_NOT_OPERATOR, "detail": f"{type(exc).__name__}: {exc}"}
    try:
        runner = await _fold(log)
        if routes_proj.admitted_route(runner["catalog"].routes, host_id, model_id) is None:
            return {"withdrawn": False, "reason": REVOKE_NOT_ADMITTED,
                    "detail": f"no admitted route of {model_id} on {host_id}"}
        result = await log.append(RouteWithdrawn(event_id=new_event_id(), at=time.time(), host_id=host_id,
                                                 model_id=model_id, reason=reason))
    except (LogError, msgspec.ValidationError) as exc:
        return {"withdrawn": False, "reason": ADMIT_LOG_ERROR, "detail": f"{type(exc).__name__}: {exc}"}
    finally:
        await log.close()
    return {"withdrawn": True, "reason": "", "detail": "", "host_id": host_id, "model_id": model_id,
            "stream": result.stream, "seq": result.seq}


@engine_app.command("revoke")
def revoke(
    host_id: str = typer.Argument(..., help="The host whose external route is withdrawn."),
    model: str = typer.Argument(..., help="The model id of the route."),
    reason: str = typer.Option("", "--reason", help="Why the route is withdrawn (kept in the event; no secrets)."),
    nats: Optional[str] = NatsOption,
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Withdraw an external route's admission (a RouteWithdrawn signed as the operator); the engine keeps running."""
    outcome = _run(_revoke(_nats_url(nats), host_id, model, reason))
    if as_json:
        typer.echo(json.dumps(outcome, indent=2))
        if not outcome["withdrawn"]:
            raise typer.Exit(1)
        return
    if not outcome["withdrawn"]:
        _fail(f"nothing withdrawn ({outcome['reason']}): {outcome['detail']}")
    typer.echo(f"withdrew the route of {model} on {host_id}, log seq {outcome['seq']}; the engine keeps running")


async def _routes(url: str) -> list[dict[str, Any]]:
    log = await _operator_log(url)
    try:
        runner = await _fold(log)
    finally:
        await log.close()
    state = runner["catalog"].routes
    return [msgspec.to_builtins(state.admitted[k]) for k in sorted(state.admitted)]


@engine_app.command("routes")
def routes(
    nats: Optional[str] = NatsOption,
    as_json: bool = typer.Option(False, "--json", help="Print the admitted routes as JSON."),
) -> None:
    """The external routes an operator admitted (from the control stream)."""
    rows = _run(_routes(_nats_url(nats)))
    if as_json:
        typer.echo(json.dumps({"routes": rows}, indent=2))
        return
    if not rows:
        typer.echo("no external route is admitted")
        return
    table = Table("host", "model", "kind", "endpoint fingerprint", "log seq", "reason")
    for r in rows:
        table.add_row(r["host_id"], r["model_id"], r["kind"], r["url_fingerprint"][:16], str(r["seq"]),
                      r["reason"] or "-")
    Console(width=200).print(table)
