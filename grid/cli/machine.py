"""gridctl machine add | join: one command each to add a controller, a gateway or an operator machine.

`add` runs where the authority lives (the first controller's grid home) and writes a bundle of
exactly what that role needs (grid.identity.bundle.ROLE_CONTENTS); `join` installs it on the new
machine, with the grid's NATS and admin URLs in machine.json, so plain commands there need no
flags. Hosts join differently (`gridctl invite` / `gridctl node join`): their credentials expire
and renew, and they never hold a token.
"""

from __future__ import annotations

import shlex
import time
import uuid
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

import typer

from grid.cli.admin import admin_urls, find_admin_url
from grid.cli.common import JsonOption, config, console, err_console, fail, print_json
from grid.config import GridConfig, NatsUrlNotFound, resolve_nats_url
from grid.identity.authority import AuthorityError
from grid.identity.bundle import (
    NAME_GRAMMAR, NEXT_COMMAND, ROLE_CONTENTS, Bundle, BundleError, collect, conflicts, entry_for, install, pack,
    read_bundle, write_bundle,
)
from grid.secrets import SecretFileError

machine_app = typer.Typer(help="Add a controller, gateway or operator machine: a bundle made here, joined there.",
                          no_args_is_help=True)

LOOPBACK_HOSTS = ("localhost", "::1")
# The any-addresses: a server listening on every interface, not an address to connect to.
UNSPECIFIED_HOSTS = ("0.0.0.0", "::")
# What a person is most likely to trip on next, after the next command (human output only).
HINTS = {
    "gateway": "it listens on loopback; --host 0.0.0.0 needs client keys (GRID_GATEWAY_API_KEYS). It holds no "
               "operator token, so it refuses evaluation-marked requests unless GRID_GATEWAY_OWNER_TOKEN_FILE "
               "names a copy of it",
    "controller": "it stands by until the active controller's lease lapses; give operators every controller's "
                  "admin URL (--admin a,b)",
}


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(u.strip().rstrip("/") for u in (value or "").split(",") if u.strip())


def _loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def _unspecified(url: str) -> bool:
    """The any-address a server listens on (`--admin-host 0.0.0.0` records it as its URL): this
    machine can connect to it, no other machine can."""
    return (urlsplit(url).hostname or "") in UNSPECIFIED_HOSTS


def _unreachable(url: str) -> str | None:
    if _loopback(url):
        return "is on loopback"
    if _unspecified(url):
        return "names no address (a server listening on every interface records it)"
    return None


def _warnings(role: str, nats: tuple[str, ...], admin: tuple[str, ...]) -> list[str]:
    """What would leave the new machine unable to reach the grid: URLs on this machine's loopback
    (what a local `gridctl up` records) or its any-address (what `--admin-host 0.0.0.0` records),
    or no admin URL for an operator machine."""
    out = [f"{url} {why}: another machine cannot reach it (pass --nats with the address it can)"
           for url in nats if (why := _unreachable(url))]
    out += [f"{url} {why}: another machine cannot reach it (pass --admin with the address it can)"
            for url in admin if (why := _unreachable(url))]
    if role == "operator" and not admin:
        out.append("no admin URL: `gridctl status` there needs --admin until you pass --admin here")
    return out


@machine_app.command("add")
def add(
    role: str = typer.Argument(..., metavar="controller|gateway|operator",
                               help="What the new machine runs: a second controller (same authority), a gateway, "
                                    "or an operator's gridctl."),
    output: Path = typer.Option(..., "--output", "-o",
                                help="Bundle file to write (owner-only; it holds secrets: copy it over an encrypted "
                                     "channel and delete it once joined)."),
    name: Optional[str] = typer.Option(None, "--name",
                                       help=f"The new machine's name, recorded in the bundle ({NAME_GRAMMAR}; "
                                            "default: ROLE-<random>)."),
    nats: Optional[str] = typer.Option(
        None, "--nats", envvar="GRID_NATS_URL",
        help="NATS URLs the new machine connects to, a cluster's comma-separated (default: this grid's, which "
             "is loopback for a local `gridctl up`)."),
    admin: Optional[str] = typer.Option(
        None, "--admin", envvar="GRID_ADMIN_URL",
        help="Admin API URLs of every controller, comma-separated, for commands on the new machine (default: "
             "this machine's running controller)."),
    force: bool = typer.Option(False, "--force", help="Replace FILE if it exists."),
    json_out: bool = JsonOption,
) -> None:
    """Bundle what a new controller, gateway or operator machine needs (run it where the authority lives).

    Each bundle carries a fresh credential of its own for that machine. Controller, gateway and operator credentials cannot be revoked (they live in the grid's account), and a controller bundle carries the authority itself: keep and move a bundle as you would the grid home."""
    if role not in ROLE_CONTENTS:
        fail(f"unknown role {role!r}: one of {', '.join(ROLE_CONTENTS)}")
    cfg = config()
    try:
        nats_urls = _split(resolve_nats_url(nats, cfg))
    except NatsUrlNotFound:
        fail("no NATS URL for the bundle: pass --nats with the servers the new machine reaches "
             "(e.g. tls://grid.example.lan:4222)")
        raise AssertionError from None  # unreachable: fail() exits
    admin_list = tuple(admin_urls(found)) if (found := find_admin_url(admin)) else ()
    chosen = name or f"{role}-{uuid.uuid4().hex[:8]}"
    try:
        bundle = collect(cfg.home, role, name=chosen, nats_urls=nats_urls, admin_urls=admin_list, now=time.time())
        data = pack(bundle)
        write_bundle(output, data, force=force)
    except (BundleError, AuthorityError, SecretFileError) as exc:
        fail(str(exc))
        raise AssertionError from exc
    warnings = _warnings(role, nats_urls, admin_list)
    if json_out:
        print_json({"output": str(output), "bytes": len(data), **_manifest_json(bundle),
                    "next": f"gridctl machine join {output.name}", "warnings": warnings})
        return
    console.print(f"{role} bundle for {chosen} written to {output} ({len(data)} bytes, owner-only):",
                  highlight=False, markup=False)
    for path in bundle.contents:
        entry = entry_for(role, path)
        assert entry is not None
        key = f" (key {bundle.issued[path]})" if path in bundle.issued else ""
        console.print(f"  {path}  {entry.source.value}{key}: {entry.why}", highlight=False, markup=False)
    for warning in warnings:
        err_console.print(f"warning: {warning}", style="yellow", highlight=False, markup=False)
    console.print(f"on the new machine: gridctl machine join {output.name}, then {NEXT_COMMAND[role]}; "
                  "delete the bundle on both machines once joined", style="dim", highlight=False, markup=False)


def _manifest_json(bundle: Bundle) -> dict[str, Any]:
    m = bundle.manifest
    files = []
    for f in m.files:
        entry = entry_for(m.role, f.path)
        files.append({"path": f.path, "source": entry.source.value if entry else None, "sha256": f.sha256,
                      "size": f.size, "key": bundle.issued.get(f.path)})
    return {"role": m.role, "name": m.name, "nats_urls": list(m.nats_urls), "admin_urls": list(m.admin_urls),
            "created_at": m.created_at, "files": files}


@machine_app.command("join")
def join(
    bundle_file: Path = typer.Argument(..., metavar="FILE", help="The bundle `gridctl machine add` wrote."),
    home: Optional[Path] = typer.Option(None, "--home",
                                        help="Grid home to install into (default: GRID_HOME or ~/.grid)."),
    force: bool = typer.Option(
        False, "--force",
        help="Install over an existing identity: replaces the files the bundle carries and machine.json, and "
             "leaves everything else in the home as it is."),
    json_out: bool = JsonOption,
) -> None:
    """Check a bundle and install it into this machine's grid home (owner-only).

    The grid's NATS and admin URLs go to machine.json there, so commands on this machine need no --nats or --admin."""
    current = config().home
    target = home.expanduser() if home is not None else current
    try:
        bundle = read_bundle(bundle_file)
    except BundleError as exc:
        fail(f"{bundle_file}: {exc}; nothing was installed")
        raise AssertionError from exc
    existing = conflicts(bundle, target)
    if existing and not force:
        fail(f"{target} already holds an identity ({', '.join(str(p) for p in existing[:3])}"
             f"{' and more' if len(existing) > 3 else ''}): pass --force to replace it, or --home another directory")
    try:
        record = install(bundle, target, now=time.time())
    except (SecretFileError, OSError) as exc:
        fail(f"cannot install into {target}: {exc}")
        raise AssertionError from exc
    command = NEXT_COMMAND[record.role]
    if target != current:
        command = f"GRID_HOME={shlex.quote(str(target))} {command}"
    if json_out:
        print_json({"home": str(target), "role": record.role, "name": record.name, "installed": list(record.files),
                    "machine_file": str(GridConfig(home=target, nats_url=None).machine_file),
                    "nats_urls": list(record.nats_urls), "admin_urls": list(record.admin_urls), "next": command})
        return
    console.print(f"joined as {record.role} {record.name}: installed in {target} (owner-only)",
                  highlight=False, markup=False)
    for path in record.files:
        console.print(f"  {path}", highlight=False, markup=False)
    console.print(f"  machine.json  NATS {','.join(record.nats_urls)}"
                  + (f"; admin {','.join(record.admin_urls)}" if record.admin_urls else ""),
                  highlight=False, markup=False)
    console.print(f"next: {command}", highlight=False, markup=False)
    if record.role in HINTS:
        console.print(f"  ({HINTS[record.role]})", style="dim", highlight=False, markup=False)
    console.print(f"then delete {bundle_file}: it holds this machine's secrets", style="dim", highlight=False,
                  markup=False)
