"""gridctl status | model set/rm | mode | tick | forecast-window: the allocator's admin API from the terminal.

The admin URL comes from --admin, GRID_ADMIN_URL, GRID_HOME/admin.url (written by the running
controller), or GRID_HOME/machine.json (`gridctl machine join`); each but admin.url may name every
controller's, comma-separated: the next is asked when one cannot be reached (any controller
answers reads and records operator changes in the log; they share the authority and the operator
token). Mutations send the operator token from --token-file, GRID_ALLOCATOR_CONTROL_TOKEN,
or the owner-only GRID_HOME/operator.token.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import httpx
import msgspec
import typer
from rich.markup import escape
from rich.table import Table

from grid.cli.common import JsonOption, config, console, err_console, fail, hardware_cells_with_versions, print_json
from grid.cli.profile_options import option_of, profile_values, with_profile_options
from grid.config import machine_urls
from grid.events.control import MODEL_ID_GRAMMAR, model_id_error, profile_values_error
from grid.fleet.hardware import HARDWARE_COLUMNS
from grid.secrets import SecretFileError, read_secret

AdminOption = typer.Option(None, "--admin", envvar="GRID_ADMIN_URL",
                           help="Admin API URL, or every controller's comma-separated (the next is asked when one "
                                "cannot be reached; default: GRID_HOME/admin.url of the running controller).")
TokenFileOption = typer.Option(None, "--token-file", envvar="GRID_ALLOCATOR_TOKEN_FILE",
                               help="Operator token file (default: GRID_HOME/operator.token).")
TIMEOUT_SECONDS = 30.0

model_app = typer.Typer(help="Create, replace or retire model profiles.", no_args_is_help=True)


# --- plumbing -----------------------------------------------------------------------------------


def find_admin_url(explicit: str | None = None) -> str | None:
    """--admin, else GRID_ADMIN_URL, else GRID_HOME/admin.url (written by the running controller),
    else the admin URLs `gridctl machine join` recorded in GRID_HOME/machine.json (every
    controller's, comma-separated: an operator machine runs none of its own)."""
    explicit = explicit or os.environ.get("GRID_ADMIN_URL")
    if explicit:
        return explicit.rstrip("/")
    home = config().home
    path = home / "admin.url"
    if path.exists():
        value = path.read_text().strip()
        if value:
            return value.rstrip("/")
    joined = ",".join(u.rstrip("/") for u in machine_urls(home, "admin_urls"))
    return joined or None


def admin_urls(value: str) -> list[str]:
    """The admin URLs `value` names, in the order to ask them (one, or several comma-separated)."""
    return [u.strip().rstrip("/") for u in value.split(",") if u.strip()]


def admin_url(explicit: str | None) -> str:
    url = find_admin_url(explicit)
    if url is None:
        fail(f"no admin API found: start the grid with `gridctl up`, or pass --admin URL "
             f"(looked for {config().home / 'admin.url'} and the admin URLs of `gridctl machine join` "
             f"in {config().machine_file})")
        raise AssertionError  # unreachable
    return url


def read_token() -> str | None:
    """The operator token when one is configured, for reads off loopback (None: loopback needs none)."""
    if os.environ.get("GRID_ALLOCATOR_CONTROL_TOKEN") or config().operator_token_path.exists():
        try:
            return operator_token(None)
        except typer.Exit:
            return None
    return None


def operator_token(token_file: Path | None) -> str:
    env = os.environ.get("GRID_ALLOCATOR_CONTROL_TOKEN")
    if token_file is None and env:
        return env.strip()
    path = token_file or config().operator_token_path
    if not path.exists():
        fail(f"operator token file {path} not found (the controller creates it at first start)")
    try:
        return read_secret(path)
    except SecretFileError as exc:
        fail(f"operator token: {exc}")
        raise AssertionError from exc  # unreachable: fail() exits


def request(method: str, url: str, path: str, *, token: str | None = None, body: Any = None,
            missing_ok: bool = False) -> Any:
    """The admin API's JSON answer; a refusal is a clear error. With `missing_ok`, 404 is None."""
    headers = {"X-Grid-Allocator-Token": token} if token else {}
    urls = admin_urls(url)
    if not urls:
        fail(f"no admin API URL in {url!r}")
    with httpx.Client(timeout=TIMEOUT_SECONDS) as client:
        for i, base in enumerate(urls):
            try:
                resp = client.request(method, base + path, headers=headers,
                                      content=msgspec.json.encode(body) if body is not None else None)
                break
            except httpx.HTTPError as exc:
                # A change that may have been sent is never sent again elsewhere; a read may be.
                unsent = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                if i + 1 < len(urls) and (unsent or method == "GET"):
                    err_console.print(f"admin API at {base} did not answer ({type(exc).__name__}); "
                                      f"asking {urls[i + 1]}", style="dim", markup=False, highlight=False)
                    continue
                tried = ", ".join(urls[:i + 1])
                fail(f"cannot reach the admin API at {tried}: {exc}. Is the controller running (`gridctl up`)?")
                raise AssertionError from exc
    try:
        data = resp.json()
    except ValueError:
        data = {"error": "bad_response", "detail": resp.text[:300]}
    if missing_ok and resp.status_code == 404 and data.get("error") == "unknown_model":
        return None
    if resp.status_code == 401:
        fail("unauthorized: the operator token was refused (check --token-file / GRID_HOME/operator.token)")
    if resp.status_code >= 400:
        field = f" (field {data.get('field')})" if data.get("field") else ""
        fail(f"{resp.status_code} {data.get('error', 'error')}{field}: {data.get('detail', '')}")
    return data


# --- status -------------------------------------------------------------------------------------


def _age(value: float | None) -> str:
    if value is None:
        return "never"
    return f"{value:.0f}s" if value < 120 else f"{value / 60:.0f}m"


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{float(value):.3f}"


def _render_unplaceable(rows: Any) -> None:
    """Models that will not become ready by waiting (the gateway answers 503 without Retry-After)."""
    for row in rows:
        detail = f": {row['detail']}" if row.get("detail") else ""
        console.print(f"  cannot be placed: {row['model_id']} ({row['reason']}){detail}", style="yellow",
                      markup=False, highlight=False)


def _render_quarantines(rows: Any) -> None:
    """Hosts and models held out of new placement because their lifecycle flaps, until when."""
    if not rows:
        return
    table = Table(title="Flap quarantine (new replicas only where nothing else can serve; incumbents stay)", title_justify="left")
    for col in ("kind", "subject", "reason", "transitions", "backoff level", "until", "remaining"):
        table.add_column(col)
    for q in rows:
        until = datetime.fromtimestamp(q["until"], tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        table.add_row(q["kind"], q["subject"], q["reason"], str(q["transitions"]), str(q["level"]), until,
                      _age(q["remaining_seconds"]))
    console.print(table)


def _render_workloads(rows: Any) -> None:
    """One admission row per active workload's `auto` traffic: its model, the replica counts
    (desired/planned/ready/missing), eligible hosts, startup estimate and the concrete reason
    (the states are grid.controller.workload_status's)."""
    if not rows:
        return
    table = Table(title="Workloads (auto traffic)", title_justify="left")
    for col in ("workload", "state", "model", "offered", "desired", "planned", "ready", "missing", "eligible",
                "startup", "why"):
        table.add_column(col)
    for w in rows:
        why = w["reason"] or w["detail"]
        if w["reason"] and w["detail"]:
            why = f"{w['reason']}: {w['detail']}"
        if w.get("served_by"):
            why = f"{why}; served by {w['served_by']} meanwhile" if why else f"served by {w['served_by']}"
        model = (w["model_id"] or "-") + (" (joint)" if w.get("joint") else "") + \
            (" (exploring)" if w.get("exploring") else "")
        eligible = "-" if w.get("eligible_hosts") is None else str(w["eligible_hosts"])
        startup = "-" if w.get("startup_seconds") is None else f"{w['startup_seconds']:.0f}s"
        table.add_row(w["workload"], w["state"], model, f"{w['offered_concurrency']:.2f}", str(w["desired"]),
                      str(w["planned"]), str(w["ready"]), str(w["missing"]), eligible, startup, why or "-")
    console.print(table)


def _mib(value: Any) -> str:
    return "?" if value is None else f"{int(value) / (1 << 20):.0f} MiB"


# How status names where a store reading came from (grid.controller.store_view).
_STORE_SOURCES = {"local_server_disk": "local disk", "jetstream_account_info": "JetStream account",
                  "none": "not measured"}


def _render_store(store: Any) -> None:
    """The event log store's pressure: the local disk beside the server, or the JetStream account's
    storage and limit on a cluster; what is unknown says why."""
    if not store:
        return
    source = store.get("source")
    head = f"event log store ({_STORE_SOURCES.get(source, source)})" if source else "event log store"
    if store.get("free_bytes") is not None:
        room = "free" if source != "jetstream_account_info" else "left of the account limit:"
        space = (f"{room} {_mib(store['free_bytes'])} of {_mib(store['total_bytes'])} "
                 f"(warns below {_mib(store['warn_free_bytes'])})   ")
    else:
        space = ""
    line = (f"{head}: {store['state']}   {space}JetStream stores "
            f"{_mib(store['jetstream_storage_bytes'])}, reserves {_mib(store['jetstream_reserved_bytes'])}")
    if store.get("recoveries"):
        line += f"   recovered {store['recoveries']}x"
    if store.get("reason"):
        line += f"   ({store['reason']})"
    console.print(line, style="dim" if store["state"] == "ok" else "yellow", markup=False, highlight=False)


def _render_qualifications(s: dict[str, Any]) -> None:
    """Each host's latest qualification per runtime and model, and the hosts a profile that
    requires qualification may not use (nothing when there is neither)."""
    rows = [(h["host_id"], q) for h in s["hosts"] for q in h.get("qualifications") or ()]
    if rows:
        table = Table(title="Qualifications", title_justify="left")
        for col in ("host", "runtime", "model", "digest", "result", "age"):
            table.add_column(col)
        for host_id, q in rows:
            result = q["result"] if q["result"] == "passed" else \
                f"failed at {q['failed_step']} ({q['reason']})"
            table.add_row(host_id, q["runtime"], q["model_id"], (q["artifact_sha256"] or "-")[:12], result,
                          _age(q["age_seconds"]))
        console.print(table)
    for x in s.get("qualification_exclusions") or ():
        console.print(f"{x['model_id']} excludes host {x['host_id']}: {x['reason']} ({escape(x['detail'])})",
                      highlight=False)


# The agent's heartbeat warning for an external engine whose probe failed
# (grid.agent.external.reports): "external_engine_<reason>: <model> at <url>: <detail>".
EXTERNAL_WARNING_PREFIX = "external_engine_"


def external_failure(warnings: Any, model_id: str) -> str | None:
    """Why the external engine for `model_id` failed ("unreachable: <detail>"), from its host's
    heartbeat warnings; None when no warning names it."""
    for w in warnings:
        head, sep, rest = str(w).partition(": ")
        if not sep or not head.startswith(EXTERNAL_WARNING_PREFIX) or not rest.startswith(f"{model_id} at "):
            continue
        reason = head[len(EXTERNAL_WARNING_PREFIX):]
        _where, sep, detail = rest.partition(": ")
        return f"{reason}: {detail}" if sep and detail else reason
    return None


def _ownership_label(r: dict[str, Any], host_warnings: Any) -> str:
    """'' for a managed residency; '(ext)' for an external one, with the probe's reason when it failed
    (an operator reading `failed(ext)` alone cannot tell a stopped engine from a refused key)."""
    if r["managed"]:
        return ""
    why = external_failure(host_warnings, r["model_id"]) if r["state"] == "failed" else None
    return f"(ext: {why})" if why else "(ext)"


def _render_drains(drains: Any, now: float | None) -> None:
    """Each draining host, its evacuation deadline, and the last copies it keeps past it."""
    for d in drains:
        left = "" if now is None else (
            "passed" if d["deadline_passed"] else f"in {max(0.0, d['deadline_at'] - now):.0f}s")
        kept = "; ".join(f"{r['model_id']} kept until replaced ({r['reason']})" for r in d["risks"])
        console.print(f"  draining {d['host_id']}: evacuation deadline {left}" + (f"; {kept}" if kept else ""),
                      style="yellow" if kept else "dim", markup=False, highlight=False)


def _render_expired(history: Any) -> None:
    """Recent commands that expired undelivered (their host went silent before accepting them)."""
    for c in history:
        if c["status"] == "expired":
            console.print(f"  expired: {c['kind']} {c['model_id']} on {c['host_id']} ({c['message']}): the host "
                          "went silent and never accepted it before its lease ran out",
                          style="yellow", markup=False, highlight=False)


def _offered(h: dict[str, Any]) -> str:
    """What the planner may place into on a host, and why it is less than the host has."""
    if "offered_mb" not in h:  # a controller older than these fields
        return "?"
    why = "; ".join(h.get("offered_reasons") or ())
    return f"{h['planner_free_mb']}/{h['offered_mb']}" + (f" ({why})" if why else "")


def _use(h: dict[str, Any]) -> str:
    """Dedicated or employee machine and its yield to the user: "dedicated", "employee, yields
    300s", "employee, never yields"; "-" when the host does not say (or the controller is older)."""
    kind, seconds = h.get("use") or "", h.get("yield_to_user_seconds")
    if not kind and seconds is None:
        return "-"
    yields = "never yields" if seconds is None else f"yields {seconds:g}s"
    if kind == "dedicated" and seconds is None:
        return kind  # the seed's always-on server: never yielding goes without saying
    return f"{kind}, {yields}" if kind else yields


def render_status(s: dict[str, Any]) -> None:
    ctl, mode, lease = s["controller"], s["mode"], (s["controller"].get("lease") or {})
    tick = s.get("last_tick") or {}
    plan = s.get("plan") or {}
    rev = s["revisions"]
    mode_text = mode["requested"] if mode["requested"] == mode["effective"] else \
        f"{mode['requested']} (running as {mode['effective']})"
    console.print(f"[bold]mode[/bold] {mode_text}   [bold]lease[/bold] {lease.get('state')} term "
                  f"{lease.get('term')} ({ctl.get('id')})   [bold]plan[/bold] {plan.get('generation') or '-'}")
    controllers = s.get("controllers") or []
    if controllers:
        console.print("[bold]controllers[/bold] " + ", ".join(
            f"{c['controller_id']} {c['state']}" + (f" term {c['term']}" if c["state"] == "active" else "")
            for c in controllers), highlight=False)
    console.print(f"last tick {tick.get('duration_ms', 0):.1f} ms, {tick.get('cpu_ms', 0):.1f} ms CPU "
                  f"({tick.get('reason', '-')})   revisions "
                  f"dirty {rev['dirty']} processed {rev['processed']} success {rev['success']}   "
                  f"log durable: {mode['log_durable']}", style="dim")
    _render_store(s.get("store"))

    hosts = Table(title="Hosts", title_justify="left")
    for col in ("host", "state", "use", "heartbeat", "capacity MiB", "used MiB", "free MiB",
                "planner free/offered MiB", "domain", "residencies"):
        hosts.add_column(col)
    # Claims the gateway does not route (the warnings below say why).
    unplaced = {(c["host_id"], c["model_id"], c.get("managed", True)) for c in s.get("unplaced_claims") or ()}
    for h in s["hosts"]:
        res = ", ".join(f"{r['model_id']}:{r['state']}" + _ownership_label(r, h.get("warnings") or ())
                        + ("" if (h["host_id"], r["model_id"], r["managed"]) not in unplaced
                           else " (unplaced claim)" if r["managed"] else " (unadmitted claim)")
                        for r in h["residencies"])
        state = h["state"] if h["fresh"] else f"{h['state']} (stale)"
        if h.get("protection_reason") and h["state"] != "accepting":
            state = f"{state}: {h['protection_reason']}"  # why a host takes no new work (e.g. cpu_high)
        if h.get("revoked"):  # `gridctl node revoke`: not merely stale
            state = "revoked " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(h["revoked_at"]))
        hosts.add_row(h["host_id"], state, _use(h), _age(h["heartbeat_age_seconds"]), str(h["capacity_mb"]),
                      str(h["used_mb"]), str(h["free_mb"]), _offered(h), h["failure_domain"], res or "-")
    console.print(hosts)
    _render_qualifications(s)
    hardware = Table(title="Hardware", title_justify="left")
    for col in ("host", *HARDWARE_COLUMNS):
        hardware.add_column(col)
    for h in s["hosts"]:
        if h.get("hardware"):  # a controller older than the hardware columns sends none
            hardware.add_row(h["host_id"], *hardware_cells_with_versions(h["hardware"]))
    if hardware.row_count:
        console.print(hardware)

    models = Table(title="Models", title_justify="left")
    for col in ("model", "wanted", "placed", "ready", "evidence", "shortfall"):
        models.add_column(col)
    for m in s["models"]:
        short = m["shortfall"]
        models.add_row(m["model_id"] + (" (retired)" if m["retired"] else ""), str(m["wanted"]), str(m["placed"]),
                       str(m["ready"]), m["evidence"] or "-",
                       f"{short['placed']}/{short['wanted']} {short['reason']}" if short else "-")
    console.print(models)
    _render_unplaceable(s.get("unplaceable") or ())
    _render_quarantines(s.get("flap_quarantines") or ())
    _render_drains(s.get("drains") or (), s.get("now"))
    _render_workloads(s.get("workloads") or ())

    rec = s.get("reconciliation") or {}
    if s["pending_commands"] or rec.get("actions"):
        pend = Table(title="Pending mutations", title_justify="left")
        for col in ("action", "kind", "host", "model", "status", "reason"):
            pend.add_column(col)
        for c in s["pending_commands"]:
            status = c["status"] + (f" ({c['waiting']})" if c.get("waiting") else "")
            pend.add_row(c["action_id"][:12], c["kind"], c["host_id"], c["model_id"], status, c["reason"])
        for a in rec.get("actions", ()):
            label = "proposed" if mode["effective"] != "automatic" else "issuing"
            pend.add_row(a["action_id"][:12], a["kind"], a["host_id"], a["model_id"], label, a["reason"])
        console.print(pend)
    if s["withdrawn_commands"] or rec.get("blocked"):
        wd = Table(title="Withdrawn commands", title_justify="left")
        for col in ("action", "kind", "host", "model", "status", "reason"):
            wd.add_column(col)
        for c in s["withdrawn_commands"]:
            wd.add_row(c["action_id"][:12], c["kind"], c["host_id"], c["model_id"], c["status"], c["withdrawn_reason"])
        console.print(wd)
        for b in rec.get("blocked", ()):
            console.print(f"  destructive work for {b['model_id']} blocked: {b['reason']} "
                          f"({len(b['action_ids'])} unconfirmed)", style="yellow")
    _render_expired(s.get("history") or ())
    deferred = rec.get("deferred", ())
    if deferred:
        counts: dict[str, int] = {}
        for d in deferred:
            counts[d["reason"]] = counts.get(d["reason"], 0) + 1
        console.print("deferred: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())), style="dim")
    analytics = s.get("analytics")
    if analytics:
        demand = Table(title=f"Demand, last {analytics.get('window_seconds', 3600) / 60:.0f} min (analytics)",
                       title_justify="left")
        for col in ("model", "requests", "errors", "p50 s", "p99 s"):
            demand.add_column(col)
        for row in analytics.get("recent_demand", ()):
            demand.add_row(str(row.get("model")), str(row.get("requests")), str(row.get("errors")),
                           _seconds(row.get("p50_seconds")), _seconds(row.get("p99_seconds")))
        console.print(demand)
        if not analytics.get("recent_demand"):
            console.print("(no requests in this window)", style="dim")
        for warning in analytics.get("warnings", ()):  # a damaged store quarantined and rebuilt
            err_console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
        if analytics.get("rebuilding"):
            console.print("analytics: catching up with the log", style="dim")
        if analytics.get("error"):
            err_console.print(f"[yellow]warning:[/yellow] analytics: {analytics['error']}")
    elif analytics is None and "analytics" in s:
        console.print("analytics: off in this controller (history reads the store file)", style="dim")
    explanation = plan.get("explanation_text") or []
    if explanation:
        console.print("[bold]Planner[/bold]")
        for line in explanation[:40]:
            console.print(f"  {line}")
    for w in s.get("warnings", ()):
        err_console.print(f"[yellow]warning:[/yellow] {w}")


def status(
    json_out: bool = JsonOption,
    admin: Optional[str] = AdminOption,
    token_file: Optional[Path] = TokenFileOption,
    watch: Optional[float] = typer.Option(
        None, "--watch", "-w", min=0.2, metavar="SECONDS",
        help="Redraw every SECONDS until Ctrl-C (with --json: one JSON document per line)."),
) -> None:
    """Allocator status: hosts, models, pending mutations, withdrawn commands, plan, recent demand, warnings."""
    if watch is None:
        _status_once(json_out, admin, token_file)
        return
    try:
        while True:
            if not json_out:
                console.clear()
                console.print(f"every {watch:g}s   {time.strftime('%H:%M:%S')}   (Ctrl-C stops)", style="dim")
            _status_once(json_out, admin, token_file, compact=True)
            time.sleep(watch)
    except KeyboardInterrupt:
        return


def _status_once(json_out: bool, admin: Optional[str], token_file: Optional[Path], compact: bool = False) -> None:
    url = admin_url(admin)
    token = None
    if token_file is not None or os.environ.get("GRID_ALLOCATOR_CONTROL_TOKEN") or config().operator_token_path.exists():
        try:
            token = operator_token(token_file)
        except typer.Exit:
            token = None  # status is open on loopback; the token only matters off loopback
    data = request("GET", url, "/allocator/status", token=token)
    if json_out and compact:
        sys.stdout.write(msgspec.json.encode(data).decode() + "\n")
        sys.stdout.flush()
    elif json_out:
        print_json(data)
    else:
        render_status(data)


# --- model set / rm -----------------------------------------------------------------------------


@model_app.command("set")
@with_profile_options  # an option per declared profile field, after the model id
def model_set(
    model_id: str = typer.Argument(..., help="Model id (e.g. the GGUF file name): " + MODEL_ID_GRAMMAR + "."),
    replace: bool = typer.Option(
        False, "--replace",
        help="Replace the whole profile: options not given take the new-profile defaults (the old behaviour)."),
    json_out: bool = JsonOption,
    admin: Optional[str] = AdminOption,
    token_file: Optional[Path] = TokenFileOption,
    **fields: Any,
) -> None:
    """Create a model profile, or change only the given fields of an existing one (--replace: all of them).

    Prints the resulting profile."""
    body = profile_values(fields)
    # Refused here, before anything is sent, by the same grammar and bounds the server applies.
    _check_model_id(model_id)
    bad = profile_values_error(body)
    if bad is not None:
        field = bad.rsplit("`$.", 1)[-1].split("`")[0].split("[")[0] if "`$." in bad else ""
        fail(escape(f"{option_of(field)}: {bad}" if field else bad))
    # A patch may keep the profile's digest and size: the server checks the merged profile.
    url = admin_url(admin)
    token = operator_token(token_file)
    path = f"/allocator/models/{model_id}"
    data = None
    if not replace:
        if not body:
            fail("nothing to change: give at least one option (see `gridctl model set --help`)")
        data = request("PATCH", url, path, token=token, body=body, missing_ok=True)
    if data is None:  # a new profile (or --replace): the whole profile, defaults for the rest
        if "memory_mb" not in body:
            fail(f"{model_id} has no profile yet: --memory-mb is required to create one")
        if body.get("artifact_source") and (not body.get("artifact_sha256") or body.get("artifact_size_mb") is None):
            fail("--artifact-source requires --artifact-sha256 and --artifact-size-mb")
        data = request("PUT", url, path, token=token, body=body)
    if json_out:
        print_json(data)
        return
    console.print(f"profile {model_id} set (log seq {data.get('seq')})")
    _render_profile(data.get("profile") or {})


def _check_model_id(model_id: str) -> None:
    error = model_id_error(model_id)
    if error is not None:
        fail(escape(error))


def _render_profile(profile: dict[str, Any]) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in profile.items():
        if isinstance(value, (list, tuple)):
            value = ", ".join(map(str, value)) or "-"
        elif isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
        unit = " MiB" if key.endswith("_mb") and value is not None and not isinstance(value, str) else ""
        table.add_row(key, f"{'-' if value is None else value}{unit}")
    console.print(table)


def model_rm(
    model_id: str = typer.Argument(...),
    json_out: bool = JsonOption,
    admin: Optional[str] = AdminOption,
    token_file: Optional[Path] = TokenFileOption,
) -> None:
    """Retire a model profile: a durable tombstone drains managed copies to zero."""
    _check_model_id(model_id)
    url = admin_url(admin)
    data = request("DELETE", url, f"/allocator/models/{model_id}", token=operator_token(token_file))
    if json_out:
        print_json(data)
    else:
        console.print(f"profile {model_id} retired: managed copies will be drained (log seq {data.get('seq')})")


model_app.command("rm")(model_rm)
model_app.command("remove", help="Alias of `model rm`.")(model_rm)


# --- mode / tick --------------------------------------------------------------------------------


def mode(
    value: str = typer.Argument(..., metavar="observe|recommend|automatic",
                                help="The mode: observe (plan only), recommend (plan and propose) or automatic (act)."),
    json_out: bool = JsonOption,
    admin: Optional[str] = AdminOption,
    token_file: Optional[Path] = TokenFileOption,
) -> None:
    """Select the allocator mode: observe, recommend (a new grid's default) or automatic (actuates within
    governors; `gridctl up` starts in automatic unless given --mode)."""
    if value not in ("observe", "recommend", "automatic"):
        fail(f"mode must be observe, recommend or automatic, not {value!r}")
    data = request("PUT", admin_url(admin), "/allocator/mode", token=operator_token(token_file), body={"mode": value})
    if json_out:
        print_json(data)
    else:
        console.print(f"mode {value}")


def forecast_window(
    bucket_seconds: float = typer.Argument(
        ..., metavar="SECONDS", min=1.0, max=3600.0,
        help="Length of one demand bucket, 1-3600 s (default 60). The forecast counts its windows in buckets "
             "(an evidence gate of 15), so 4 makes that gate one minute; demand already bucketed starts afresh."),
    json_out: bool = JsonOption,
    admin: Optional[str] = AdminOption,
    token_file: Optional[Path] = TokenFileOption,
) -> None:
    """Set the forecast's demand bucket on the log (shorter buckets compress every forecast window alike)."""
    data = request("PUT", admin_url(admin), "/allocator/forecast-window", token=operator_token(token_file),
                   body={"bucket_seconds": bucket_seconds})
    if json_out:
        print_json(data)
    else:
        console.print(f"demand buckets of {bucket_seconds:g} s")


def tick(
    json_out: bool = JsonOption,
    admin: Optional[str] = AdminOption,
    token_file: Optional[Path] = TokenFileOption,
) -> None:
    """Request an immediate reconciliation pass."""
    data = request("POST", admin_url(admin), "/allocator/tick", token=operator_token(token_file), body={"reason": "gridctl"})
    if json_out:
        print_json(data)
        return
    t = data.get("tick", {})
    console.print(f"tick {t.get('number')} in {t.get('duration_ms', 0):.1f} ms ({t.get('effective_mode')}): "
                  f"{data.get('actions', 0)} actions, {data.get('deferred', 0)} deferred, "
                  f"{t.get('published', 0)} commands published")
    if t.get("error"):
        err_console.print(f"[yellow]warning:[/yellow] {t['error']}")


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.add_typer(model_app, name="model")
    app.command("mode")(mode)
    app.command("tick")(tick)
    app.command("forecast-window")(forecast_window)
