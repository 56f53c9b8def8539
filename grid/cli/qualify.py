"""gridctl qualify llama.cpp MODEL | external URL --model NAME: run a runtime's real lifecycle on
this host and record the outcome as this host's signed evidence on the log.

The run itself is grid.agent.qualification. The evidence is written with this host's own
credential (the one `node join` received, or the one `gridctl up` made for its local agent), so a
host can only ever vouch for itself. Exit status: 0 passed, 1 failed (the failed step and its
reason are printed), 2 when the run could not be recorded or the host not identified.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from grid.agent import external
from grid.agent.identity import stored_host_id
from grid.agent.launch import Refused, parse_port_range, read_joined
from grid.agent.qualification import (
    ExternalOptions,
    ExternalQualification,
    LlamaCppOptions,
    LlamaCppQualification,
    Observer,
    Qualification,
    StepResult,
)
from grid.agent.state import AgentPaths
from grid.cli.common import JsonOption, console, err_console, print_json, resolve_nats_url
from grid.config import GridConfig
from grid.events import codec
from grid.events.control import ProfileSet
from grid.events.log import AppendResult, LogError
from grid.events.subjects import escape_token, profile_subject
from grid.transport.jetstream import JetStreamLog

qualify_app = typer.Typer(
    help="Run a runtime's real lifecycle for a model on this host and record the outcome as this host's "
         "signed evidence (profiles with --require-qualified place only on hosts that passed).",
    no_args_is_help=True,
)

EXIT_FAILED = 1
EXIT_NOT_RECORDED = 2

NatsOption = typer.Option(None, "--nats", envvar="GRID_NATS_URL",
                          help="NATS URL of the grid (default: this host's enrolment, else the local `gridctl up`).")
StateDirOption = typer.Option(None, "--state-dir", envvar="GRID_AGENT_STATE_DIR",
                              help="This host's agent state directory, which names the host and its enrolment "
                                   "(default: GRID_HOME/agent).")
HostIdOption = typer.Option(None, "--host-id", help="This host's id when the state directory has none yet "
                                                    "(must be the id its credential speaks for).")
CredentialsOption = typer.Option(None, "--credentials",
                                 help="This host's .creds file (default: the enrolment's, else the local grid's "
                                      "credential for this host id).")
NoRecordOption = typer.Option(False, "--no-record", help="Run the qualification without writing evidence to the log.")


class _Progress(Observer):
    """One line per finished step, a spinner while a step runs (nothing at all with --json)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.status: Any = None

    def started(self, name: str) -> None:
        if self.enabled:
            self.status = console.status(f"{name} ...")
            self.status.start()

    def finished(self, result: StepResult) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
        if not self.enabled:
            return
        if result.ok:
            console.print(f"[green]ok[/green]     {result.name:<13} {result.seconds:7.2f}s  {escape(result.detail)}",
                          highlight=False)
        else:
            console.print(f"[red]FAILED[/red] {result.name:<13} {result.seconds:7.2f}s  {result.reason}: "
                          f"{escape(result.detail)}", highlight=False)


class _HostLog:
    """Where this host's evidence goes: its id and how to reach the log as itself."""

    def __init__(self, host_id: str, url: str, credentials: Path | None, tls_ca: Path | None) -> None:
        self.host_id, self.url, self.credentials, self.tls_ca = host_id, url, credentials, tls_ca

    async def connect(self) -> JetStreamLog:
        from grid.identity.connect import connect_log

        return await connect_log(self.url, credentials=self.credentials, tls_ca=self.tls_ca,
                                 name="gridctl-qualify", ensure_streams=self.credentials is None)


def _fail(message: str, code: int = EXIT_NOT_RECORDED) -> None:
    err_console.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(code)


def _host_log(nats: str | None, state_dir: Path | None, host_id: str | None,
              credentials: Path | None) -> _HostLog:
    """This host's identity, from (first match) --credentials, the enrolment `node join` kept, or
    the local grid's credential for the state directory's (or --host-id's) host."""
    from grid.identity.creds import credential_principal
    from grid.identity.local import local_credential, local_tls_ca
    from grid.identity.permissions import Role

    cfg = GridConfig.from_environ()
    paths = AgentPaths.for_config(cfg, state_dir)
    joined = read_joined(paths)
    if isinstance(joined, Refused):
        _fail(joined.message)
        raise AssertionError
    if credentials is not None:
        principal = credential_principal(credentials)
        if principal is None or principal.role is not Role.HOST or principal.host_id is None:
            _fail(f"{credentials} is not a host credential")
            raise AssertionError
        if host_id and host_id != principal.host_id:
            _fail(f"{credentials} speaks for host {principal.host_id!r}, not {host_id!r}")
        return _HostLog(principal.host_id, resolve_nats_url(nats, cfg), credentials, local_tls_ca(cfg.home))
    if joined is not None:
        if host_id and host_id != joined.host_id:
            _fail(f"this machine joined as host {joined.host_id!r}, not {host_id!r}")
        return _HostLog(joined.host_id, nats or joined.server, Path(joined.creds_path),
                        Path(joined.ca_path) if joined.ca_path else None)
    stored = stored_host_id(paths)
    if host_id and stored and host_id != stored:
        _fail(f"the agent state directory {paths.root} belongs to host {stored!r}, not {host_id!r}")
    chosen = host_id or stored
    if not chosen:
        _fail(f"no host id: {paths.root} has none (run `gridctl node start` once, or pass --host-id)")
        raise AssertionError
    creds = local_credential(cfg.home, f"host-{escape_token(chosen)}")
    return _HostLog(chosen, resolve_nats_url(nats, cfg), creds, local_tls_ca(cfg.home) if creds else None)


async def _profile_digest(event_log: JetStreamLog, model_id: str) -> str | None:
    """The artifact digest the model's current profile names, if it is provably an operator's."""
    msg = await event_log.last_message(profile_subject(model_id))
    if msg is None:
        return None
    authorship = event_log.authorship
    if authorship is not None and not authorship.verify(msg.subject, msg.data, msg.headers, at=msg.time).ok:
        return None
    try:
        event = codec.decode(msg.data)
    except codec.EventDecodeError:
        return None
    return event.profile.artifact_sha256 if isinstance(event, ProfileSet) else None


def _document(host_id: str | None, outcome: Qualification, recorded: AppendResult | None) -> dict[str, Any]:
    failure = outcome.failure
    return {
        "host_id": host_id, "runtime": outcome.runtime, "model_id": outcome.model_id,
        "artifact_sha256": outcome.artifact_sha256, "endpoint": outcome.endpoint,
        "result": "passed" if outcome.passed else "failed",
        "failed_step": failure.name if failure is not None else None,
        "reason": failure.reason if failure is not None else "",
        "steps": [{"name": s.name, "ok": s.ok, "seconds": s.seconds, "reason": s.reason, "detail": s.detail}
                  for s in outcome.steps],
        "recorded": None if recorded is None else {"stream": recorded.stream, "seq": recorded.seq},
    }


async def _qualify(runner: Any, target: _HostLog | None, model_id: str, digest_from_profile: bool,
                   as_json: bool) -> tuple[Qualification, AppendResult | None, str | None]:
    event_log = await target.connect() if target is not None else None
    try:
        if event_log is not None and digest_from_profile:
            runner.options.expected_sha256 = await _profile_digest(event_log, model_id)
        outcome = await runner.run(_Progress(not as_json))
        recorded = None
        if event_log is not None and target is not None:
            recorded = await event_log.append(outcome.event(target.host_id, time.time()))
        return outcome, recorded, target.host_id if target is not None else None
    finally:
        if event_log is not None:
            await event_log.close()


def _finish(run: Any, as_json: bool) -> None:
    try:
        outcome, recorded, host_id = asyncio.run(run)
    except LogError as exc:
        _fail(f"could not record the qualification on the log: {exc}")
        raise AssertionError from exc
    if as_json:
        print_json(_document(host_id, outcome, recorded))
    else:
        where = f" as host {host_id} ({recorded.stream} #{recorded.seq})" if recorded is not None else \
            " (not recorded: --no-record)"
        failure = outcome.failure
        if failure is None:
            console.print(f"[green]qualified[/green] {outcome.runtime} {escape(outcome.model_id)}{where}",
                          highlight=False)
        else:
            console.print(f"[red]not qualified[/red] {outcome.runtime} {escape(outcome.model_id)}: step "
                          f"{failure.name} failed ({failure.reason}){where}", highlight=False)
    if not outcome.passed:
        raise typer.Exit(EXIT_FAILED)


@qualify_app.command("llama.cpp")
def qualify_llama_cpp(
    model: str = typer.Argument(..., help="A model id in this host's artifact cache (see `gridctl pull`), or a "
                                          "path to a GGUF file."),
    digest: Optional[str] = typer.Option(None, "--digest", "--artifact-sha256",
                                         help="The sha256 the artifact must have (default: the model's profile "
                                              "artifact_sha256, else the digest this host's cache verified)."),
    runtime_binary: Optional[str] = typer.Option(
        None, "--runtime-binary", help="llama-server binary path, or 'xllamacpp' (default: what the agent would "
                                       "run; env GRID_RUNTIME_BINARY)."),
    port_range: str = typer.Option("38000-38999", "--port-range", help="Ports the engine under test may listen on."),
    engine_threads: Optional[int] = typer.Option(
        None, "--engine-threads", min=1, max=256,
        help="CPU threads for the engine (default: every core but one; see grid.agent.engines.llama_cpp)."),
    ready_timeout: float = typer.Option(120.0, "--ready-timeout", help="Seconds the engine may take to load."),
    nats: Optional[str] = NatsOption,
    state_dir: Optional[Path] = StateDirOption,
    host_id: Optional[str] = HostIdOption,
    credentials: Optional[Path] = CredentialsOption,
    no_record: bool = NoRecordOption,
    as_json: bool = JsonOption,
) -> None:
    """Qualify llama.cpp for MODEL: inventory, identity (sha256), warm, ownership, readiness, inference,
    activity, drain and stop, with a real engine started and stopped here."""
    ports = parse_port_range(port_range)
    if isinstance(ports, Refused):
        _fail(ports.message)
        raise AssertionError
    target = None if no_record else _host_log(nats, state_dir, host_id, credentials)
    cfg = GridConfig.from_environ()
    paths = AgentPaths.for_config(cfg, state_dir)
    runner = LlamaCppQualification(LlamaCppOptions(
        model=model, artifacts_dir=cfg.artifacts_dir, work_dir=paths.root / "qualify", expected_sha256=digest,
        runtime_binary=runtime_binary, port_range=ports, ready_timeout=ready_timeout,
        **({"threads": engine_threads} if engine_threads is not None else {}),
    ))
    model_id = Path(model).name if Path(model).expanduser().is_file() else model
    _finish(_qualify(runner, target, model_id, digest is None, as_json), as_json)


@qualify_app.command("external")
def qualify_external(
    url: str = typer.Argument(..., help="The engine's base URL, e.g. http://127.0.0.1:8080 (no credentials in it)."),
    model: str = typer.Option(..., "--model", help="The model id the endpoint lists in /v1/models."),
    api_key_file: Optional[Path] = typer.Option(None, "--api-key-file",
                                                help="An owner-only file holding the endpoint's API key (never "
                                                     "logged or recorded)."),
    nats: Optional[str] = NatsOption,
    state_dir: Optional[Path] = StateDirOption,
    host_id: Optional[str] = HostIdOption,
    credentials: Optional[Path] = CredentialsOption,
    no_record: bool = NoRecordOption,
    as_json: bool = JsonOption,
) -> None:
    """Qualify an engine Grid did not start: reachability, identity (the model is listed) and a real
    inference. It is only sent HTTP requests: never started, stopped or signalled."""
    target = None if no_record else _host_log(nats, state_dir, host_id, credentials)
    runner = ExternalQualification(ExternalOptions(url=url, model=model, api_key_file=api_key_file,
                                                   kind=external.KIND_OPENAI))
    _finish(_qualify(runner, target, model, False, as_json), as_json)
