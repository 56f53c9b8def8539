"""`gridctl machine add` / `machine join`: a bundle carries exactly its role's files, installs
owner-only, refuses hostile input without writing anything, and a joined machine finds the
grid's NATS and admin URLs with no flags. gridctl runs in-process (CliRunner); the credentials
are tried against a real nats-server in operator mode with TLS, and the operator token against a
running controller's admin API."""

from __future__ import annotations

import asyncio
import datetime as dt
import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import typer
from typer.testing import CliRunner, Result

from grid.cli.admin import find_admin_url
from grid.cli.history import _running_admin
from grid.cli.main import app
from grid.config import GridConfig, resolve_nats_url
from grid.controller.api import serve_admin
from grid.controller.service import Controller, ControllerSettings
from grid.events.subjects import CONTROL_STREAM
from grid.identity import jwt
from grid.identity.authority import Authority
from grid.identity.bundle import MAX_BUNDLE_BYTES, MAX_CONTENT_BYTES, ROLE_CONTENTS, unpack
from grid.identity.clusterconfig import route_secret
from grid.identity.connect import connect_log
from grid.identity.creds import parse_creds
from grid.identity.durability import record_servers
from grid.identity.local import authority_dir, ensure_local_credentials, local_credential, local_tls_ca
from grid.identity.server import SecuredEmbeddedNats
from grid.identity.service import ControllerIdentity
from grid.identity.tls import TLSMaterial
from grid.secrets import load_or_create_secret
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog
from tests.security.conftest import event

SEEDS = [f"identity/{n}.nk" for n in ("operator", "system", "account", "invitee", "infer", "gateways", "operators", "readers")]
EXPECTED = {
    "controller": [*SEEDS, "identity/registry.json", "identity/nats-durability.json",
                   "identity/creds/controller.creds", "identity/creds/operator.creds", "identity/tls/ca.pem",
                   "identity/tls/server.pem", "operator.token", "reader.token"],
    "gateway": ["identity/creds/gateway.creds", "identity/tls/ca.pem"],
    "operator": ["identity/creds/operator.creds", "operator.token", "reader.token", "identity/tls/ca.pem",
                 "identity/tls/server.pem"],
}
NATS = "tls://grid.example.lan:4222,tls://nats2.example.lan:4222"
ADMIN = "http://ctl1.example.lan:8787,http://ctl2.example.lan:8787"


@pytest.fixture(autouse=True)
def _keep_structlog_config() -> Iterator[None]:
    """gridctl's callback configures structlog for the process: leave it as other tests found it."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def make_first_controller(home: Path) -> Path:
    """A first controller's grid home as `gridctl nats init --tls-name` leaves it, plus what a
    grid in use has: an admitted host (registry.json), a durability record, a route secret."""
    ensure_local_credentials(home, host_ids=[], now=time.time())
    TLSMaterial(authority_dir(home) / "tls").ensure(["127.0.0.1", "localhost"], now=dt.datetime.now(dt.timezone.utc))
    load_or_create_secret(home / "operator.token")
    authority = Authority(authority_dir(home))
    authority.host_principal("gpu-1")
    route_secret(authority)
    record_servers(home, [("grid-n1", home / "nats.conf")], sync_always=True, written_by="test")
    return home


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_first_controller(tmp_path_factory.mktemp("first") / "home")


def gridctl(home: Path, *args: str, env: dict[str, str | None] | None = None) -> Result:
    environ: dict[str, str | None] = {"GRID_HOME": str(home), "GRID_NATS_URL": None, "GRID_ADMIN_URL": None,
                                      **(env or {})}
    return CliRunner().invoke(app, list(args), env=environ)


def add(first: Path, role: str, output: Path, *args: str) -> dict[str, Any]:
    result = gridctl(first, "machine", "add", role, "--output", str(output), "--nats", NATS, "--admin", ADMIN,
                     "--json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def members(bundle: Path) -> dict[str, bytes]:
    with tarfile.open(bundle, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def creds_role(data: bytes) -> tuple[str, str]:
    claims = jwt.decode(parse_creds(data.decode())[0])
    return claims["sub"], next(t for t in claims["nats"]["tags"] if t.startswith("grid-role:"))


# --- what each role's bundle carries --------------------------------------------------------------


@pytest.mark.parametrize("role", sorted(EXPECTED))
def test_each_role_carries_exactly_its_table(first: Path, tmp_path: Path, role: str) -> None:
    bundle = tmp_path / f"{role}.bundle"
    out = add(first, role, bundle, "--name", f"{role}-7")
    assert mode(bundle) == 0o600
    inside = members(bundle)
    assert list(inside) == ["manifest.json", *EXPECTED[role]]
    assert [e.path for e in ROLE_CONTENTS[role]] == EXPECTED[role]  # every optional file is there too
    manifest = json.loads(inside["manifest.json"])
    assert manifest["version"] == 1 and manifest["role"] == role and manifest["name"] == f"{role}-7"
    assert manifest["nats_urls"] == NATS.split(",") and manifest["admin_urls"] == ADMIN.split(",")
    assert [f["path"] for f in manifest["files"]] == EXPECTED[role]
    assert all(f["sha256"] == hashlib.sha256(inside[f["path"]]).hexdigest() for f in manifest["files"])
    # No private key of a server, the CA or the routes, ever; no server config or route secret.
    assert not any(b"PRIVATE KEY" in data for data in inside.values())
    assert not any(name.endswith((".key", ".secret", ".conf")) for name in inside)
    with tarfile.open(bundle, "r:gz") as tar:
        assert all(m.isreg() and m.mode == 0o600 for m in tar.getmembers())
    # Every credential is issued for this bundle: its own key, not one of the first machine's.
    for name, data in inside.items():
        if name.endswith(".creds"):
            key, tag = creds_role(data)
            assert tag == f"grid-role:{Path(name).stem}" and key != creds_role((first / name).read_bytes())[0]
            assert out["files"][EXPECTED[role].index(name)]["key"] == key
    if role == "gateway":
        assert "operator.token" not in inside and not any(n.endswith(".nk") for n in inside)
    if role != "controller":
        assert not any(n.endswith((".nk", "registry.json")) for n in inside)
    # --json names what it wrote.
    assert out["output"] == str(bundle) and out["role"] == role and out["bytes"] == bundle.stat().st_size
    assert [f["source"] for f in out["files"]] == [e.source.value for e in ROLE_CONTENTS[role]]
    assert out["warnings"] == [] and out["next"] == f"gridctl machine join {bundle.name}"


def test_add_refuses_to_overwrite_without_force_and_needs_an_authority(first: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "gw.bundle"
    add(first, "gateway", bundle)
    before = bundle.read_bytes()
    again = gridctl(first, "machine", "add", "gateway", "--output", str(bundle), "--nats", NATS)
    assert again.exit_code == 1 and "--force" in again.stderr and bundle.read_bytes() == before
    add(first, "gateway", bundle, "--force")
    assert bundle.read_bytes() != before

    elsewhere = tmp_path / "no-authority"
    refused = gridctl(elsewhere, "machine", "add", "operator", "--output", str(tmp_path / "x"), "--nats", NATS)
    assert refused.exit_code == 1 and "no grid authority" in refused.stderr
    assert not (elsewhere / "identity").exists() and not (tmp_path / "x").exists()  # no new authority made
    for args, fragment in ((["host"], "unknown role"), (["gateway", "--name", "../x"], "machine name"),
                           (["gateway", "--nats", "http://grid:4222"], "NATS URL")):
        res = gridctl(first, "machine", "add", *args, "--output", str(tmp_path / "y"), *(
            [] if "--nats" in args else ["--nats", NATS]))
        assert res.exit_code != 0 and fragment in res.stderr, res.stderr
        assert not (tmp_path / "y").exists()


def test_loopback_urls_are_warned_about(first: Path, tmp_path: Path) -> None:
    result = gridctl(first, "machine", "add", "operator", "-o", str(tmp_path / "op"), "--nats", "nats://127.0.0.1:4222",
                     "--json")
    assert result.exit_code == 0, result.stderr
    warnings = json.loads(result.stdout)["warnings"]
    assert any("loopback" in w for w in warnings) and any("no admin URL" in w for w in warnings)


def test_any_address_urls_are_warned_about(first: Path, tmp_path: Path) -> None:
    """What a controller started with `--admin-host 0.0.0.0` records as its URL: usable on its own
    machine, not from another one."""
    result = gridctl(first, "machine", "add", "gateway", "-o", str(tmp_path / "gw"), "--nats", NATS,
                     "--admin", "http://0.0.0.0:8787,http://[::]:8787", "--json")
    assert result.exit_code == 0, result.stderr
    warnings = json.loads(result.stdout)["warnings"]
    assert [w.split(" ", 1)[0] for w in warnings if "names no address" in w] == [
        "http://0.0.0.0:8787", "http://[::]:8787"], warnings


# --- joining ---------------------------------------------------------------------------------------


def test_join_installs_owner_only_and_commands_find_the_urls(first: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = tmp_path / "op.bundle"
    add(first, "operator", bundle, "--name", "laptop")
    home = tmp_path / "op-home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)  # a home made wide by hand: the join makes it owner-only
    result = gridctl(home, "machine", "join", str(bundle), "--json")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out == {"home": str(home), "role": "operator", "name": "laptop", "installed": EXPECTED["operator"],
                   "machine_file": str(home / "machine.json"), "nats_urls": NATS.split(","),
                   "admin_urls": ADMIN.split(","), "next": "gridctl status"}
    for dirpath, dirnames, filenames in os.walk(home):
        assert mode(Path(dirpath)) == 0o700, dirpath
        assert all(mode(Path(dirpath, f)) == 0o600 for f in filenames), filenames
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file()) == \
        sorted([*EXPECTED["operator"], "machine.json"])
    assert (home / "operator.token").read_bytes() == (first / "operator.token").read_bytes()
    assert (home / "reader.token").read_bytes() == (first / "reader.token").read_bytes()
    record = json.loads((home / "machine.json").read_text())
    assert record["role"] == "operator" and record["name"] == "laptop" and record["files"] == EXPECTED["operator"]

    # NATS: --nats, then GRID_NATS_URL, then a running `gridctl up`'s nats.url, then machine.json.
    monkeypatch.setenv("GRID_HOME", str(home))
    monkeypatch.delenv("GRID_NATS_URL", raising=False)
    monkeypatch.delenv("GRID_ADMIN_URL", raising=False)
    assert resolve_nats_url(None, GridConfig.from_environ()) == NATS
    assert resolve_nats_url("nats://flag:4222", GridConfig.from_environ()) == "nats://flag:4222"
    monkeypatch.setenv("GRID_NATS_URL", "nats://env:4222")
    assert resolve_nats_url(None, GridConfig.from_environ()) == "nats://env:4222"
    monkeypatch.delenv("GRID_NATS_URL")
    (home / "nats.url").write_text("nats://127.0.0.1:4999\n")
    assert resolve_nats_url(None, GridConfig.from_environ()) == "nats://127.0.0.1:4999"
    (home / "nats.url").unlink()
    # Admin: --admin, then GRID_ADMIN_URL, then admin.url, then machine.json (every controller's).
    assert find_admin_url() == ADMIN and _running_admin() == ADMIN.split(",")
    assert find_admin_url("http://flag:1") == "http://flag:1"
    (home / "admin.url").write_text("http://127.0.0.1:8787\n")
    assert find_admin_url() == "http://127.0.0.1:8787"
    monkeypatch.setenv("GRID_ADMIN_URL", "http://env:1/")
    assert find_admin_url() == "http://env:1" and _running_admin() == ["http://env:1"]


def test_join_refuses_an_existing_identity_without_force(first: Path, tmp_path: Path) -> None:
    gateway, operator = tmp_path / "gw.bundle", tmp_path / "op.bundle"
    add(first, "gateway", gateway)
    add(first, "operator", operator)
    home = tmp_path / "home"
    assert gridctl(home, "machine", "join", str(gateway)).exit_code == 0
    creds = (home / "identity/creds/gateway.creds").read_bytes()
    again = gridctl(home, "machine", "join", str(gateway))
    assert again.exit_code == 1 and "already holds an identity" in again.stderr and "--force" in again.stderr
    assert (home / "identity/creds/gateway.creds").read_bytes() == creds

    add(first, "gateway", gateway, "--force", "--name", "gw-2")
    forced = gridctl(home, "machine", "join", str(gateway), "--force")
    assert forced.exit_code == 0, forced.stderr
    assert (home / "identity/creds/gateway.creds").read_bytes() != creds
    assert json.loads((home / "machine.json").read_text())["name"] == "gw-2"
    assert "next: gridctl serve gateway" in forced.stdout

    # A home holding an authority is a controller's: nothing is dropped into it unasked.
    before = sorted(p.name for p in (first / "identity").rglob("*"))
    refused = gridctl(first, "machine", "join", str(operator))
    assert refused.exit_code == 1 and "account.nk" in refused.stderr
    assert sorted(p.name for p in (first / "identity").rglob("*")) == before
    assert not (first / "machine.json").exists()


# --- hostile bundles -------------------------------------------------------------------------------


def _info(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o600
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def _archive(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return gzip.compress(raw.getvalue())


def _manifest(files: dict[str, bytes], **changes: Any) -> bytes:
    value = {"version": 1, "role": "gateway", "name": "gw", "nats_urls": ["tls://grid:4222"], "admin_urls": [],
             "created_at": 1.0, "files": [{"path": p, "sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                                          for p, d in files.items()]}
    value.update(changes)
    return json.dumps(value).encode()


def _bundle(files: dict[str, bytes], *extra: tuple[tarfile.TarInfo, bytes], listed: dict[str, bytes] | None = None,
            **changes: Any) -> bytes:
    """A gzip tar with a manifest listing `listed` (default `files`), then `files`, then `extra`."""
    manifest = _manifest(files if listed is None else listed, **changes)
    return _archive([_info("manifest.json", manifest), *(_info(p, d) for p, d in files.items()), *extra])


@pytest.fixture(scope="module")
def gateway_files(first: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The files of a genuine gateway bundle (checked to unpack), to build hostile ones from."""
    bundle = tmp_path_factory.mktemp("genuine") / "gw.bundle"
    add(first, "gateway", bundle)
    assert unpack(bundle.read_bytes()).manifest.role == "gateway"
    return {k: v for k, v in members(bundle).items() if k != "manifest.json"}


def _hostile(files: dict[str, bytes], first: Path) -> dict[str, tuple[bytes, str]]:
    genuine = _bundle(files)
    ca = files["identity/tls/ca.pem"]
    key = (first / "identity/tls/ca.key").read_bytes()
    operator_creds = (first / "identity/creds/operator.creds").read_bytes()
    with_key = {**files, "identity/tls/ca.pem": ca + key}
    return {
        "not gzip": (b"PK\x03\x04 not a bundle at all", "not a whole gzip file"),
        "truncated": (genuine[: len(genuine) // 2], "not a whole gzip file"),
        "dot-dot path": (_bundle(files, _info("../escape", b"x")), "not a plain relative path"),
        "nested dot-dot": (_bundle(files, _info("identity/../../escape", b"x")), "not a plain relative path"),
        "absolute path": (_bundle(files, _info("/tmp/escape", b"x")), "not a plain relative path"),
        "symlink": (_bundle(files, _info("identity/creds/x.creds", kind=tarfile.SYMTYPE, link="/etc/passwd")),
                    "a symbolic link"),
        "hardlink": (_bundle(files, _info("identity/x", kind=tarfile.LNKTYPE, link="identity/tls/ca.pem")),
                     "a hard link"),
        "device": (_bundle(files, _info("identity/dev", kind=tarfile.CHRTYPE)), "a device"),
        "directory": (_bundle(files, _info("identity", kind=tarfile.DIRTYPE)), "a directory"),
        "unlisted member": (_bundle(files, _info("identity/extra.txt", b"x")), "not listed in manifest.json"),
        "not in the role's table": (_bundle({**files, "operator.token": b"f" * 64 + b"\n"}),
                                    "not a file a gateway bundle carries"),
        "listed but missing": (_bundle({}, listed=files), "missing"),
        "no manifest": (_archive([_info(p, d) for p, d in files.items()]), "no manifest.json"),
        "manifest not json": (_archive([_info("manifest.json", b"{nope")]), "not JSON"),
        "unknown version": (_bundle(files, version=2), "format version 2"),
        "unknown role": (_bundle(files, role="host"), "unknown role 'host'"),
        "unknown manifest field": (_bundle(files, signed_by="me"), "manifest.json"),
        "bad machine name": (_bundle(files, name="gw\nrm -rf"), "machine name"),
        "bad NATS URL": (_bundle(files, nats_urls=["http://grid:8080"]), "NATS URL"),
        "duplicate member": (_bundle(files, _info("identity/tls/ca.pem", ca)), "appears twice"),
        "tampered content": (_bundle(files, listed={**files, "identity/tls/ca.pem": ca + b"\n"}),
                             "does not match its sha256"),
        "private key as certificate": (_bundle(with_key), "holds a private key"),
        "another role's credential": (_bundle({**files, "identity/creds/gateway.creds": operator_creds}),
                                      "not a gateway credential"),
        "required file missing": (_bundle({"identity/tls/ca.pem": ca}), "must carry identity/creds/gateway.creds"),
        "oversized": (os.urandom(MAX_BUNDLE_BYTES + 1), "over"),
        "gzip bomb": (_bundle({**files, "identity/registry.json": b"{}"},
                              _info("padding", bytes(MAX_CONTENT_BYTES))), "unpacks to over"),
    }


HOSTILE_CASES = ["not gzip", "truncated", "dot-dot path", "nested dot-dot", "absolute path", "symlink", "hardlink",
                 "device", "directory", "unlisted member", "not in the role's table", "listed but missing",
                 "no manifest", "manifest not json", "unknown version", "unknown role", "unknown manifest field",
                 "bad machine name", "bad NATS URL",
                 "duplicate member", "tampered content", "private key as certificate", "another role's credential",
                 "required file missing", "oversized", "gzip bomb"]


def test_every_hostile_bundle_is_refused_in_one_line_and_writes_nothing(
        first: Path, gateway_files: dict[str, bytes], tmp_path: Path) -> None:
    cases = _hostile(gateway_files, first)
    assert sorted(cases) == sorted(HOSTILE_CASES)
    for case, (data, fragment) in cases.items():
        bundle = tmp_path / "hostile.bundle"
        bundle.write_bytes(data)
        home = tmp_path / "target" / "home"
        result = gridctl(home, "machine", "join", str(bundle))
        assert result.exit_code == 1, (case, result.stdout, result.stderr)
        message = " ".join(result.stderr.split())  # one message (a narrow terminal may wrap it)
        assert message.startswith("error:") and message.count("error:") == 1, (case, result.stderr)
        assert fragment in message and "nothing was installed" in message, (case, result.stderr)
        assert "Traceback" not in result.stderr and result.stdout == "", case
        assert not (tmp_path / "target").exists(), case
        assert not Path("/tmp/escape").exists() and not (tmp_path / "escape").exists(), case


# --- the credentials work -------------------------------------------------------------------------


async def test_joined_gateway_and_controller_connect_to_a_secured_server(tmp_path: Path) -> None:
    first = make_first_controller(tmp_path / "first")
    authority = Authority(authority_dir(first))
    server = SecuredEmbeddedNats(tmp_path / "nats", authority, tls=TLSMaterial(authority_dir(first) / "tls"))
    server.start()
    try:
        homes = {}
        for role in ("gateway", "controller"):
            bundle = tmp_path / f"{role}.bundle"
            result = gridctl(first, "machine", "add", role, "-o", str(bundle), "--nats", server.url)
            assert result.exit_code == 0, result.stderr
            homes[role] = tmp_path / f"{role}-home"
            assert gridctl(homes[role], "machine", "join", str(bundle)).exit_code == 0

        # What `gridctl serve gateway` does there, with nothing but the joined home.
        gw_home = homes["gateway"]
        url = resolve_nats_url(None, GridConfig(home=gw_home, nats_url=None))
        assert url == server.url
        gateway = await connect_log(url, credentials=local_credential(gw_home, "gateway"),
                                    tls_ca=local_tls_ca(gw_home), name="grid-gateway", ensure_streams=False)
        await gateway.close()

        # What `gridctl serve controller` does: the same authority (no new key made), its own
        # credential, which manages streams and signs what it appends.
        ctl_home = homes["controller"]
        identity = ControllerIdentity(authority_dir(ctl_home))
        assert identity.authority.account_public == authority.account_public
        assert identity.authority.operator_public == authority.operator_public
        assert "gpu-1" in identity.authority.registry.hosts
        controller = await connect_log(resolve_nats_url(None, GridConfig(home=ctl_home, nats_url=None)),
                                       credentials=local_credential(ctl_home, "controller"),
                                       tls_ca=local_tls_ca(ctl_home), name="grid-controller", durable=False)
        try:
            await controller.append(event("control.mode_set.v1"))
            assert await controller.last_sequence(CONTROL_STREAM) >= 1
        finally:
            await controller.close()
    finally:
        server.stop()


SETTINGS = ControllerSettings(tick_interval_seconds=0.5, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0)


async def test_an_operator_machine_changes_the_mode_of_a_running_controller(
        js_log: JetStreamLog, nats_server: EmbeddedNats, tmp_path: Path) -> None:
    ctl_home = tmp_path / "ctl"
    ensure_local_credentials(ctl_home, host_ids=[], now=time.time())  # the authority `machine add` needs
    controller = Controller(js_log, ctl_home, settings=SETTINGS, controller_id="ctl-machine")
    await controller.start()
    admin = None
    try:
        admin = await serve_admin(controller, "127.0.0.1", 0)
        bundle = tmp_path / "op.bundle"
        # The admin URL defaults to the running controller's (its admin.url).
        made = await asyncio.to_thread(gridctl, ctl_home, "machine", "add", "operator", "-o", str(bundle),
                                       "--nats", nats_server.url, "--json")
        assert made.exit_code == 0, made.stderr
        assert json.loads(made.stdout)["admin_urls"] == [admin.url]
        op_home = tmp_path / "op"
        assert gridctl(op_home, "machine", "join", str(bundle)).exit_code == 0
        changed = await asyncio.to_thread(gridctl, op_home, "mode", "observe")
        assert changed.exit_code == 0, changed.stderr
        assert controller.runner["catalog"].mode == "observe"
    finally:
        if admin is not None:
            await admin.stop()
        await controller.stop()


# --- help -------------------------------------------------------------------------------------------


def test_every_option_and_argument_has_help() -> None:
    machine = typer.main.get_command(app).commands["machine"]  # type: ignore[attr-defined]
    assert sorted(machine.commands) == ["add", "join"]
    for command in machine.commands.values():
        for param in command.params:
            assert getattr(param, "help", None), f"{command.name} {param.name} has no --help text"
