"""gridctl host drain | pause | quarantine | resume HOST: an operator override for any host.

`gridctl node drain|pause|...` steer the agent on this machine through its state directory;
these steer a host anywhere on the grid. The override is a `HostOverride` event on
`grid.ctl.override.<host>`, appended through the operator's own connection to the log (the
operator credential `gridctl up` made in GRID_HOME), which signs it. The host's agent reads it and
honours it only if an operator or controller provably wrote it (grid.agent.overrides); the
controller's fleet projection folds it too, so `gridctl status` shows it. `resume` appends a
release. An override from the log and one from `gridctl node` combine: the stricter applies.
"""

from __future__ import annotations

import re
import time
from typing import Any, Optional
from urllib.parse import quote

import httpx
import typer
from rich.markup import escape

from grid.agent.overrides import VERB_STATES
from grid.cli.admin import AdminOption, admin_urls, find_admin_url, read_token
from grid.cli.common import JsonOption, NatsOption, config, connect, console, err_console, fail, print_json, run
from grid.events.base import new_event_id
from grid.events.control import HostOverride

host_app = typer.Typer(help="Drain, pause, quarantine or resume any host of the grid (operator overrides).",
                       no_args_is_help=True)

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
# An override longer than a year is a typo, not an intent (resume releases an open-ended one).
MAX_EXPIRES_SECONDS = 366 * 86400.0
MAX_REASON = 200
# The drain check runs a what-if plan on the controller: bounded, and the drain is written anyway.
CHECK_TIMEOUT_SECONDS = 30.0


def parse_duration(value: str) -> float:
    """'90', '90s', '15m', '2h', '1d' -> seconds (positive, at most a year)."""
    m = _DURATION.match(value)
    if m is None:
        raise ValueError(f"{value!r} is not a duration: use N, Ns, Nm, Nh or Nd")
    seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not 0 < seconds <= MAX_EXPIRES_SECONDS:
        raise ValueError(f"{value!r}: a duration must be positive and at most {int(MAX_EXPIRES_SECONDS // 86400)} days")
    return seconds


def _check_host(host_id: str) -> None:
    if not host_id or len(host_id) > 200 or any(c.isspace() or ord(c) < 32 for c in host_id):
        fail(f"{host_id!r} is not a host id (see `gridctl status` for the fleet's hosts)")


def _send(verb: str, host_id: str, reason: str, expires: str | None, json_out: bool, nats: str | None,
          admin: str | None = None) -> None:
    _check_host(host_id)
    if len(reason) > MAX_REASON:
        fail(f"--reason is at most {MAX_REASON} characters")
    state = VERB_STATES.get(verb)  # None: resume
    expires_at: float | None = None
    if expires is not None:
        if state is None:
            fail("--expires applies to drain, pause and quarantine, not resume")
        try:
            expires_at = time.time() + parse_duration(expires)
        except ValueError as exc:
            fail(str(exc))
    event = HostOverride(event_id=new_event_id(), at=time.time(), host_id=host_id, state=state,  # type: ignore[arg-type]
                         reason=reason, expires_at=expires_at)

    async def go() -> int:
        log = await connect(nats, name="gridctl-host")
        try:
            return (await log.append(event)).seq
        finally:
            await log.close()

    seq = run(go)
    # A drain evacuates: say at once which models it would leave with no copy to serve them.
    check = drain_check(host_id, admin) if verb == "drain" else None
    if json_out:
        doc = {"host_id": host_id, "state": state, "reason": reason, "expires_at": expires_at, "seq": seq}
        if check is not None:
            doc["drain_check"] = check
        print_json(doc)
        return
    if state is None:
        console.print(f"{host_id}: override released (seq {seq})")
    else:
        until = f" until {time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(expires_at))}" if expires_at else ""
        console.print(f"{host_id}: {state}{until} (seq {seq})")
    if check is not None:
        print_drain_check(check)


def drain_check(host_id: str, admin: str | None = None) -> dict[str, Any]:
    """The controller's what-if for draining `host_id` (GET /allocator/hosts/{host}/drain-check), or
    {"known": false, "reason": ...} saying why it could not be asked: the drain itself is written
    to the log either way."""
    url = find_admin_url(admin)
    if url is None:
        return {"host_id": host_id, "known": False, "reason": "no_admin_api",
                "detail": f"no admin API found (GRID_ADMIN_URL or {config().home / 'admin.url'})"}
    token = read_token()
    unreachable = []
    for base in admin_urls(url):  # every controller's may be named: the first that answers
        try:
            resp = httpx.get(f"{base}/allocator/hosts/{quote(host_id, safe='')}/drain-check",
                             timeout=CHECK_TIMEOUT_SECONDS, headers={"X-Grid-Allocator-Token": token} if token else {})
            data = resp.json()
            break
        except (httpx.HTTPError, ValueError) as exc:
            unreachable.append(f"{base}: {exc}")
    else:
        return {"host_id": host_id, "known": False, "reason": "admin_api_unreachable", "detail": "; ".join(unreachable)}
    if resp.status_code != 200 or not isinstance(data, dict):
        return {"host_id": host_id, "known": False, "reason": "admin_api_refused",
                "detail": f"{resp.status_code} {data.get('error') if isinstance(data, dict) else ''}"}
    return data


def print_drain_check(check: dict[str, Any]) -> None:
    """The drain check for people: each last copy at risk as a warning, or that there is none."""
    if not check.get("known"):
        detail = f": {check['detail']}" if check.get("detail") else ""
        err_console.print(f"[yellow]note:[/yellow] could not check what the drain leaves unserved "
                          f"({escape(str(check.get('reason')))}{escape(detail)}); `gridctl status` shows it")
        return
    for w in check.get("warnings") or ():
        err_console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    if not check.get("risks"):
        console.print(f"no model is left without a copy: what {check['host_id']} serves is ready elsewhere (drained "
                      f"once its replacement is ready, or at the {check['evacuation_deadline_seconds']:g} s "
                      "evacuation deadline) or has a replacement planned (drained once it is ready)",
                      style="dim", highlight=False)


ReasonOption = typer.Option("", "--reason", help="Why (shown in status and the agent's protection reason).")
ExpiresOption = typer.Option(None, "--expires", metavar="DURATION",
                             help="Release automatically after DURATION (90s, 15m, 2h, 1d); default: until resumed.")
HostArgument = typer.Argument(..., metavar="HOST", help="The host id (as `gridctl status` lists it).")


@host_app.command("drain")
def drain(host_id: str = HostArgument, reason: str = ReasonOption, expires: Optional[str] = ExpiresOption,
          json_out: bool = JsonOption, nats: Optional[str] = NatsOption, admin: Optional[str] = AdminOption) -> None:
    """Stop placing new work on HOST and move its models elsewhere (make-before-break); warns at once
    about each model whose last copy is there and that no other host can take (kept, serving, past
    the evacuation deadline until a replacement is ready)."""
    _send("drain", host_id, reason, expires, json_out, nats, admin)


@host_app.command("pause")
def pause(host_id: str = HostArgument, reason: str = ReasonOption, expires: Optional[str] = ExpiresOption,
          json_out: bool = JsonOption, nats: Optional[str] = NatsOption) -> None:
    """Pause HOST: it takes no new work."""
    _send("pause", host_id, reason, expires, json_out, nats)


@host_app.command("quarantine")
def quarantine(host_id: str = HostArgument, reason: str = ReasonOption, expires: Optional[str] = ExpiresOption,
               json_out: bool = JsonOption, nats: Optional[str] = NatsOption) -> None:
    """Quarantine HOST: fenced off until resumed."""
    _send("quarantine", host_id, reason, expires, json_out, nats)


@host_app.command("resume")
def resume(host_id: str = HostArgument, reason: str = ReasonOption,
           json_out: bool = JsonOption, nats: Optional[str] = NatsOption) -> None:
    """Release HOST's operator override (one set with `gridctl node` on that machine stays)."""
    _send("resume", host_id, reason, None, json_out, nats)
