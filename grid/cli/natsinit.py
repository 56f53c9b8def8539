"""gridctl nats init: the authority and server configuration for an existing NATS server.

`gridctl up` does all of this for its embedded server. For a server or cluster you run, this
writes the operator/account material under GRID_HOME, a credential per local component, and
the configuration snippet (operator, accounts resolver, optionally TLS) your server includes.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Optional

import typer

from grid.cli.natscluster import cluster_config
from grid.cli.common import JsonOption, config, console, print_json
from grid.identity.authority import Authority
from grid.identity.local import CREDS_DIR, TLS_DIR, authority_dir, ensure_local_credentials
from grid.identity.tls import TLSMaterial
from grid.secrets import load_or_create_secret, write_owner_only

nats_app = typer.Typer(help="Prepare an existing NATS server for this grid's identities.", no_args_is_help=True)

SNIPPET_FILE = "grid-nats.conf"


@nats_app.command("init")
def init(
    tls_name: list[str] = typer.Option(
        [], "--tls-name", help="Hostname or IP clients reach the server by (repeatable): turns TLS on with "
                               "a certificate from Grid's private CA. Needed for any listener off loopback."),
    resolver_dir: Optional[Path] = typer.Option(
        None, "--resolver-dir", help="Directory on the server machine for the account resolver's store "
                                     "(default: beside the authority)."),
    server_dir: Optional[Path] = typer.Option(
        None, "--server-dir", help="Also write the snippet and the TLS server key pair here (a directory "
                                   "only the NATS server reads; it gets no other secret)."),
    gateway_home: Optional[Path] = typer.Option(
        None, "--gateway-home", help="Also give a gateway running with this GRID_HOME its own credential "
                                     "(and the CA), and nothing else."),
    json_out: bool = JsonOption,
) -> None:
    """Write the operator/account material, local credentials and the server config snippet."""
    cfg = config()
    cfg.ensure_home()
    now = time.time()
    directory = authority_dir(cfg.home)
    authority = Authority(directory)
    credentials = ensure_local_credentials(cfg.home, host_ids=[], now=now)
    # `gridctl invite` needs the operator token; the controller would make it on first start.
    load_or_create_secret(cfg.operator_token_path)
    snippet = authority.server_config(now=now, resolver_dir=resolver_dir)
    fingerprint = None
    tls = None
    if tls_name:
        tls = TLSMaterial(directory / TLS_DIR).ensure(tls_name, now=dt.datetime.now(dt.timezone.utc))
        fingerprint = tls.server_fingerprint()
    path = directory / SNIPPET_FILE
    write_owner_only(path, (snippet + (tls.server_config() if tls else "")).encode())
    if server_dir is not None:
        _export_server(server_dir, snippet, tls)
    if gateway_home is not None:
        _export(credentials.gateway, authority_dir(gateway_home) / CREDS_DIR / "gateway.creds")
        if tls is not None:
            _export(tls.ca_cert, authority_dir(gateway_home) / TLS_DIR / "ca.pem")
    if json_out:
        print_json({"server_config": str(path), "operator": authority.operator_public,
                    "account": authority.account_public, "tls_fingerprint": fingerprint,
                    "credentials": {"controller": str(credentials.controller), "gateway": str(credentials.gateway),
                                    "operator": str(credentials.operator)}})
        return
    console.print(f"server config snippet: {path}", highlight=False, soft_wrap=True)
    console.print(f"  copy it beside your nats-server config and add the line: include {SNIPPET_FILE}",
                  highlight=False, soft_wrap=True)
    console.print("  (it turns on operator mode: from then on every client needs a credential)", style="dim")
    if fingerprint:
        console.print(f"  TLS server certificate fingerprint (join tokens pin it): {fingerprint}", highlight=False, soft_wrap=True)
    console.print(f"credentials (owner-only) under {credentials.controller.parent}", highlight=False, soft_wrap=True)
    console.print("then: gridctl up --nats URL, and gridctl invite for each machine", style="dim")


def _export(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_owner_only(target, source.read_bytes())


def _export_server(server_dir: Path, snippet: str, tls: TLSMaterial | None) -> None:
    """The snippet with its TLS block pointing at copies of the server key pair in `server_dir`."""
    server_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if tls is not None:
        copy = TLSMaterial(server_dir)
        _export(tls.server_cert, copy.server_cert)
        _export(tls.server_key, copy.server_key)
        snippet += copy.server_config()
    write_owner_only(server_dir / SNIPPET_FILE, snippet.encode())


# `gridctl nats cluster-config` lives in its own module (one command, one file).
nats_app.command("cluster-config")(cluster_config)


def register(app: typer.Typer) -> None:
    app.add_typer(nats_app, name="nats")
