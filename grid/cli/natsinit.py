"""gridctl nats init: the authority and server configuration for an existing NATS server.

`gridctl up` does all of this for its embedded server. For a server or cluster you run, this
writes the operator/account material under GRID_HOME, a credential per local component, and
the configuration snippet (operator, accounts resolver, optionally TLS) your server includes,
and a whole server config around it (`nats-server.conf`: JetStream with fsync on every write,
the snippet included) to start nats-server from. That config's durability is recorded under
GRID_HOME (grid.identity.durability), so `gridctl up --nats URL` runs automatic mode against
that server without `--assume-durable`.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Optional

import typer

from grid.cli.natscluster import cluster_config, local_authority
from grid.cli.common import JsonOption, config, console, print_json
from grid.identity.authority import Authority
from grid.identity.durability import record_servers
from grid.identity.local import CREDS_DIR, TLS_DIR, authority_dir
from grid.identity.tls import TLSMaterial
from grid.secrets import write_owner_only

nats_app = typer.Typer(help="Prepare an existing NATS server for this grid's identities.", no_args_is_help=True)

SNIPPET_FILE = "grid-nats.conf"
SERVER_FILE = "nats-server.conf"


def server_name(authority: Authority) -> str:
    """The server_name of the config this authority's `nats init` writes: stable across re-runs
    (the record names it), distinct between grids."""
    return f"grid-{authority.account_public[-10:].lower()}"


def server_config(name: str, *, listen: str, monitor_port: int, store_dir: Path) -> str:
    """A whole nats-server config: JetStream with fsync on every write, and the snippet beside it."""
    monitor = f"http: 127.0.0.1:{monitor_port}\n" if monitor_port else ""
    return (
        "# Written by `gridctl nats init`: JetStream on file storage with fsync on every write, and the\n"
        "# grid's operator mode (and TLS) from the snippet beside this file. `gridctl up --nats` trusts\n"
        "# a server running this config (it recognises the server_name) as durable.\n"
        f"server_name: {name}\n"
        f"listen: {listen}\n"
        f"{monitor}"
        f"jetstream {{\n  store_dir: \"{store_dir}\"\n  sync_interval: always\n}}\n"
        f"include {SNIPPET_FILE}\n"
    )


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
    listen: Optional[str] = typer.Option(
        None, "--listen", metavar="HOST:PORT",
        help=f"Client listener of the {SERVER_FILE} written (default 0.0.0.0:4222 with --tls-name, else 127.0.0.1:4222)."),
    store_dir: Optional[Path] = typer.Option(
        None, "--store-dir", help=f"JetStream store directory of the {SERVER_FILE} written (default: a `jetstream` "
                                  "directory beside it)."),
    monitor_port: int = typer.Option(8222, "--monitor-port", min=0, max=65535,
                                     help="Monitoring port on loopback in that config (0: none)."),
    json_out: bool = JsonOption,
) -> None:
    """Write the operator/account material, local credentials, the server config snippet and a whole
    server config (fsync on every write) around it."""
    cfg = config()
    now = time.time()
    directory, authority, credentials = local_authority(cfg, now)
    snippet = authority.server_config(now=now, resolver_dir=resolver_dir)
    fingerprint = None
    tls = None
    if tls_name:
        tls = TLSMaterial(directory / TLS_DIR).ensure(tls_name, now=dt.datetime.now(dt.timezone.utc))
        fingerprint = tls.server_fingerprint()
    path = directory / SNIPPET_FILE
    write_owner_only(path, (snippet + (tls.server_config() if tls else "")).encode())
    name = server_name(authority)
    bind = listen or ("0.0.0.0:4222" if tls_name else "127.0.0.1:4222")
    servers = [(name, _write_server_config(directory, name, bind, monitor_port, store_dir))]
    if server_dir is not None:
        _export_server(server_dir, snippet, tls)
        servers.append((name, _write_server_config(server_dir, name, bind, monitor_port, store_dir)))
    # The last one written is the one recorded as the config (the server-dir copy, when given).
    record = record_servers(cfg.home, servers[-1:], sync_always=True, written_by="gridctl nats init", now=now)
    if gateway_home is not None:
        _export(credentials.gateway, authority_dir(gateway_home) / CREDS_DIR / "gateway.creds")
        if tls is not None:
            _export(tls.ca_cert, authority_dir(gateway_home) / TLS_DIR / "ca.pem")
    if json_out:
        print_json({"server_config": str(path), "include": SNIPPET_FILE, "operator": authority.operator_public,
                    "account": authority.account_public, "tls_fingerprint": fingerprint,
                    "credentials": {"controller": str(credentials.controller), "gateway": str(credentials.gateway),
                                    "operator": str(credentials.operator)},
                    "nats_server_config": [str(p) for _, p in servers], "server_name": name,
                    "durability_record": str(record)})
        return
    snippet_path = server_dir / SNIPPET_FILE if server_dir is not None else path
    console.print(f"server config snippet: {snippet_path}", highlight=False, soft_wrap=True)
    # nats-server resolves an include relative to the including file, never as an absolute path.
    console.print(f"  your own nats-server config includes it by its path relative to that config: "
                  f"`include {SNIPPET_FILE}` beside it, `include {snippet_path.parent.name}/{SNIPPET_FILE}` "
                  f"from {snippet_path.parent.parent}", highlight=False, soft_wrap=True)
    console.print("  (it turns on operator mode: from then on every client needs a credential)", style="dim")
    if fingerprint:
        console.print(f"  TLS server certificate fingerprint (join tokens pin it): {fingerprint}", highlight=False, soft_wrap=True)
    console.print(f"or start nats-server -c {servers[-1][1]} (JetStream with fsync on every write; "
                  f"`gridctl up --nats` trusts it as durable, recorded in {record})", highlight=False, soft_wrap=True)
    console.print(f"credentials (owner-only) under {credentials.controller.parent}", highlight=False, soft_wrap=True)
    console.print("then: gridctl up --nats URL, and gridctl invite for each machine", style="dim")


def _export(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_owner_only(target, source.read_bytes())


def _write_server_config(directory: Path, name: str, listen: str, monitor_port: int, store_dir: Path | None) -> Path:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / SERVER_FILE
    store = store_dir.expanduser() if store_dir is not None else directory / "jetstream"
    write_owner_only(path, server_config(name, listen=listen, monitor_port=monitor_port, store_dir=store).encode())
    return path


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
