"""gridctl invite: a single-use join token for one new machine (see `gridctl node join`)."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Optional

import typer

from grid.cli.common import JsonOption, check_nats_url, config, console, fail, print_json, resolve_nats_url
from grid.identity.admin import IdentityAdminError, invite
from grid.identity.invitations import split_servers
from grid.identity.local import TLS_DIR, authority_dir
from grid.identity.tls import TLSMaterial
from grid.secrets import SecretFileError, read_secret, write_owner_only

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: str) -> float:
    """'15m', '2h', '90s' or plain seconds."""
    match = _DURATION.match(value)
    if match is None or float(match.group(1)) <= 0:
        raise typer.BadParameter(f"a positive duration such as 15m, 2h or 90s, not {value!r}")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def invite_command(
    host_id: Optional[str] = typer.Option(None, "--host-id", help="Host id the new machine joins as (default: a fresh one)."),
    ttl: str = typer.Option("15m", "--ttl", help="How long the token can be redeemed (e.g. 15m, 2h)."),
    failure_domain: Optional[str] = typer.Option(None, "--failure-domain", help="Failure domain of the new host."),
    tags: Optional[str] = typer.Option(None, "--tags", help="Comma-separated placement tags (a,b)."),
    dedicated: bool = typer.Option(False, "--dedicated", help="The machine serves Grid only (no user to yield to)."),
    server: Optional[str] = typer.Option(
        None, "--server", help="NATS URL the new machine connects to (default: this grid's URL)."),
    nats: Optional[str] = typer.Option(None, "--nats", envvar="GRID_NATS_URL", help="NATS URL of the grid (default: the local `gridctl up`)."),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", help="Write the token to this file (owner-only) instead of printing it."),
    json_out: bool = JsonOption,
) -> None:
    """Print one join token (single use, expiring); needs this grid's operator token."""
    cfg = config()
    try:
        read_secret(cfg.operator_token_path)
    except SecretFileError as exc:
        fail(f"the operator token is needed to invite a machine: {exc}")
    ttl_seconds = parse_duration(ttl)
    tag_list = tuple(t.strip() for t in (tags or "").split(",") if t.strip())
    # A cluster's comma-separated list is its separate servers in the token (one each).
    servers = split_servers(check_nats_url(server) if server else resolve_nats_url(nats, cfg))
    chosen = host_id or f"host-{uuid.uuid4().hex[:12]}"
    # With TLS (`gridctl nats init --tls-name`) the token pins the server certificate.
    tls = TLSMaterial(authority_dir(cfg.home) / TLS_DIR)
    fingerprint = tls.server_fingerprint() if tls.server_cert.exists() else None
    try:
        invitation, token = invite(cfg.home, servers, host_id=chosen, now=time.time(), ttl_seconds=ttl_seconds,
                                   failure_domain=failure_domain, tags=tag_list, dedicated=dedicated,
                                   tls_fingerprint=fingerprint)
    except (IdentityAdminError, ValueError) as exc:
        fail(str(exc))
        raise AssertionError from exc
    if output is not None:
        write_owner_only(output, (token + "\n").encode())
        console.print(f"invitation for host {invitation.host_id} written to {output}", highlight=False)
        return
    if json_out:
        print_json({"host_id": invitation.host_id, "invitation_id": invitation.invitation_id,
                    "expires_at": invitation.expires_at, "token": token})
        return
    console.print(f"invitation for host {invitation.host_id} (single use, expires in {ttl}):", style="dim",
                  highlight=False)
    # The token alone on stdout's last line, unwrapped, for copy and paste or `$(...)`.
    print(token)
    console.print("on the new machine: gridctl node join <token>, then gridctl node start", style="dim",
                  highlight=False)


def register(app: typer.Typer) -> None:
    app.command("invite")(invite_command)
