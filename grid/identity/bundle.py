"""Machine bundles: what one more controller, gateway or operator machine needs from the first
controller's grid home, packed there (`gridctl machine add`) and installed on the new machine
(`gridctl machine join`).

A bundle is a gzip tar of files named by their path under GRID_HOME (the same on both machines,
so every command there finds them where it looks today: grid.identity.local, GridConfig) and a
`manifest.json` listing each with its sha256. ROLE_CONTENTS below is the only list of what a
role's bundle may carry; packing reads it, and unpacking refuses anything else.

Where the code can mint a credential for a role, the bundle carries a fresh one (its own user
key), so each machine connects as itself. Controller, gateway and operator users live in the
grid's own account, which never revokes a user (grid.identity.authority: its JWT must never
change), so such a credential cannot be taken back short of a new authority: a bundle is as
precious as what it carries, and is written owner-only.

Deliberately left out of every bundle, whatever the role:
  tls/ca.key           mints server certificates every machine trusts; only where they are made
  tls/server.key, route.pem/route.key, route.secret, nats-auth.conf, grid-nats.conf,
  nats-server.conf, resolver/
                       the NATS servers' own material (`gridctl nats init --server-dir` and
                       `nats cluster-config` hand it to the servers); no Grid process reads it
  system-*.creds       made from system.nk for each push of account JWTs
  invitations.json     single-use join secrets (hashed): a copy would let one token be
                       redeemed once per copy
  engine.secret, agent state, artifacts, analytics.duckdb
                       per machine, never shared
  gateway.creds        (gateway role only) carries no operator token either: see ROLE_CONTENTS
"""

from __future__ import annotations

import enum
import gzip
import hashlib
import io
import json
import re
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import msgspec
import nkeys
from cryptography import x509
from nats_jwt.nkeys_ext import create_user_pair

from grid.config import MACHINE_FILE, GridConfig
from grid.identity import jwt
from grid.identity.authority import Authority
from grid.identity.creds import CredentialsError, format_creds, parse_creds
from grid.identity.durability import DURABILITY_FILE
from grid.identity.local import AUTHORITY_DIR, CREDS_DIR, TLS_DIR
from grid.identity.permissions import Principal, Role, principal_from_tags
from grid.secrets import OPERATOR_TOKEN_FILE, READER_TOKEN_FILE, ensure_private_dir, load_or_create_secret, write_owner_only

BUNDLE_VERSION = 1
MANIFEST_NAME = "manifest.json"
# What a join reads at most: the file as copied, and what it unpacks to (a gzip bomb stops here).
# A bundle is a few kilobytes; the registry of a large fleet is the only part that grows.
MAX_BUNDLE_BYTES = 1 << 20
MAX_CONTENT_BYTES = 4 << 20
MAX_MEMBERS = 32
NAME_GRAMMAR = "1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
NATS_SCHEMES = ("nats", "tls", "ws", "wss")
ADMIN_SCHEMES = ("http", "https")


class BundleError(ValueError):
    """A bundle that cannot be made or installed; the message says which part and why."""


class Source(enum.Enum):
    COPY = "copied"  # the file as it is in the first controller's grid home
    ISSUE = "issued"  # a fresh user key and credential, made for this bundle only
    TOKEN = "shared"  # a grid-wide token, made in the first controller's home if it has none yet


@dataclass(frozen=True)
class Entry:
    path: str  # under GRID_HOME, on both machines
    source: Source
    why: str
    required: bool = True
    issue_as: Role | None = None  # Source.ISSUE: the role the credential is issued for


def _identity(*parts: str) -> str:
    return "/".join((AUTHORITY_DIR, *parts))


def _seed(name: str, why: str) -> Entry:
    return Entry(_identity(f"{name}.nk"), Source.COPY, why)


CA_CERT = Entry(_identity(TLS_DIR, "ca.pem"), Source.COPY,
                "Grid's private CA certificate: verifies the NATS servers (a grid without TLS has none)",
                required=False)
SERVER_CERT = Entry(_identity(TLS_DIR, "server.pem"), Source.COPY,
                    "the servers' TLS certificate, never its key: `gridctl invite` pins its fingerprint",
                    required=False)
OPERATOR_TOKEN = Entry(OPERATOR_TOKEN_FILE, Source.TOKEN,
                       "the admin API's operator token: every controller must accept the same one")
READER_TOKEN = Entry(READER_TOKEN_FILE, Source.TOKEN,
                     "the read-only token: the same on every controller, so a dashboard link works on any")

ROLE_CONTENTS: dict[str, tuple[Entry, ...]] = {
    # A second controller is the first one's peer: the same authority (it pushes account JWTs at
    # start and on each admission, signs host JWTs on joins and renewals), its own connection.
    "controller": (
        _seed("operator", "the operator key: signs the account JWTs the servers trust"),
        _seed("system", "the SYS account key: the controller's claims pushers (system-*.creds) are made from it"),
        _seed("account", "the GRID account key: signs every user JWT and the role certificates folds verify"),
        _seed("invitee", "the INVITEE account key: revokes a spent join token's key"),
        _seed("infer", "the INFER account key: imports each admitted host's inference service for gateways"),
        _seed("gateways", "the GATEWAYS account key: the gateways' credentials live in it"),
        _seed("operators", "the OPERATORS account key: operators' credentials live in it"),
        _seed("readers", "the READERS account key: readers' credentials live in it"),
        Entry(_identity("registry.json"), Source.COPY,
              "admitted hosts (accounts, command consumers, keys, revocations): a copy as of this bundle, "
              "not kept in step afterwards", required=False),
        Entry(_identity(DURABILITY_FILE), Source.COPY,
              "servers whose config Grid wrote to fsync every write: automatic mode without --assume-durable",
              required=False),
        Entry(_identity(CREDS_DIR, "controller.creds"), Source.ISSUE, "its own NATS connection",
              issue_as=Role.CONTROLLER),
        # grid.identity.admin.apply_requested_revocations signs the revocation it applies as the
        # home's operator identity; gridctl on that machine reads the log with it too.
        Entry(_identity(CREDS_DIR, "operator.creds"), Source.ISSUE,
              "signs the revocations it applies for operator machines; gridctl's reads there",
              issue_as=Role.OPERATOR),
        CA_CERT, SERVER_CERT, OPERATOR_TOKEN, READER_TOKEN,
    ),
    # A gateway faces clients: it gets its own credential and the CA, nothing that could change
    # the grid. Not the operator token, though the gateway reads it (GRID_GATEWAY_OWNER_TOKEN_FILE,
    # default GRID_HOME/operator.token) to let the owner mark evaluation traffic: it is the whole
    # admin API's key, too much for an internet-facing machine. Without it that gateway refuses
    # evaluation-marked requests (403); an owner who wants them there copies the token by hand.
    "gateway": (
        Entry(_identity(CREDS_DIR, "gateway.creds"), Source.ISSUE,
              "its own NATS connection (with its INFER identity inside)", issue_as=Role.GATEWAY),
        CA_CERT,
    ),
    # An operator machine changes the grid through the admin API and the log, never through the
    # authority: `gridctl node revoke` there asks on the log and a controller applies it.
    "operator": (
        Entry(_identity(CREDS_DIR, "operator.creds"), Source.ISSUE,
              "reads the log (events, replay); signs operator events (node revoke asks a controller)",
              issue_as=Role.OPERATOR),
        OPERATOR_TOKEN,
        Entry(READER_TOKEN_FILE, Source.TOKEN,
              "`gridctl dashboard token` hands out the grid's read-only token, not one no controller knows"),
        CA_CERT, SERVER_CERT,
    ),
}

# The command that runs the joined machine's part.
NEXT_COMMAND = {"controller": "gridctl serve controller", "gateway": "gridctl serve gateway",
                "operator": "gridctl status"}


class BundleFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    path: str
    sha256: str
    size: int


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    version: int
    role: str
    name: str
    files: tuple[BundleFile, ...]
    nats_urls: tuple[str, ...]
    admin_urls: tuple[str, ...]
    created_at: float


class MachineRecord(msgspec.Struct, frozen=True):
    """GRID_HOME/machine.json on a joined machine (grid.config reads its URLs)."""

    version: int
    role: str
    name: str
    nats_urls: tuple[str, ...]
    admin_urls: tuple[str, ...]
    files: tuple[str, ...]
    bundle_created_at: float
    joined_at: float


@dataclass(frozen=True)
class Bundle:
    manifest: Manifest
    contents: dict[str, bytes]  # path -> bytes, in the manifest's order
    # Source.ISSUE paths -> the user public key issued (for the operator's records).
    issued: dict[str, str]


def entry_for(role: str, path: str) -> Entry | None:
    return next((e for e in ROLE_CONTENTS.get(role, ()) if e.path == path), None)


# --- making one ---------------------------------------------------------------------------------


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise BundleError(f"machine name {name!r} is not {NAME_GRAMMAR}")
    return name


def check_urls(urls: tuple[str, ...], schemes: tuple[str, ...], what: str) -> tuple[str, ...]:
    for url in urls:
        scheme, sep, rest = url.partition("://")
        plain = url.isprintable() and not any(c.isspace() for c in url)
        if not (sep and plain and scheme.lower() in schemes and rest.split("/", 1)[0]):
            raise BundleError(f"{what} URL {url!r} is not SCHEME://HOST:PORT with SCHEME one of {', '.join(schemes)}")
    return urls


def _authority(home: Path) -> Authority:
    directory = Path(home) / AUTHORITY_DIR
    missing = [e.path for e in ROLE_CONTENTS["controller"] if e.path.endswith(".nk") and not (home / e.path).exists()]
    if missing:
        # Authority() would make the missing keys: a new, different grid. Refuse instead.
        raise BundleError(f"no grid authority under {home} ({missing[0]} is missing): run this on the first "
                          "controller's machine, where `gridctl up` or `gridctl nats init` made it")
    return Authority(directory)


def _issue(authority: Authority, role: Role, now: float) -> tuple[bytes, str]:
    pair = create_user_pair()
    public = pair.public_key.decode()
    # No expiry: like the local credentials `gridctl up` makes, nothing renews these.
    token = authority.issue(Principal(role), public, now=now, ttl_seconds=None)
    return format_creds(token, pair.seed), public


def collect(home: Path, role: str, *, name: str, nats_urls: tuple[str, ...], admin_urls: tuple[str, ...],
            now: float) -> Bundle:
    """The bundle for a new `role` machine from the first controller's grid home `home`."""
    if role not in ROLE_CONTENTS:
        raise BundleError(f"unknown role {role!r}: one of {', '.join(ROLE_CONTENTS)}")
    check_name(name)
    if not nats_urls:
        raise BundleError("no NATS URL for the bundle: pass --nats with the servers the new machine reaches")
    check_urls(nats_urls, NATS_SCHEMES, "NATS")
    check_urls(admin_urls, ADMIN_SCHEMES, "admin")
    home = Path(home)
    authority = _authority(home)
    contents: dict[str, bytes] = {}
    issued: dict[str, str] = {}
    for entry in ROLE_CONTENTS[role]:
        path = home / entry.path
        if entry.source is Source.ISSUE:
            assert entry.issue_as is not None
            contents[entry.path], issued[entry.path] = _issue(authority, entry.issue_as, now)
        elif entry.source is Source.TOKEN:
            contents[entry.path] = (load_or_create_secret(path) + "\n").encode()
        elif path.exists():
            contents[entry.path] = path.read_bytes()
        elif entry.required:
            raise BundleError(f"{path} is missing: this grid home cannot make a {role} bundle")
        if entry.path in contents:
            check_content(entry, contents[entry.path])
    files = tuple(BundleFile(p, hashlib.sha256(b).hexdigest(), len(b)) for p, b in contents.items())
    manifest = Manifest(version=BUNDLE_VERSION, role=role, name=name, files=files, nats_urls=nats_urls,
                        admin_urls=admin_urls, created_at=now)
    return Bundle(manifest, contents, issued)


def pack(bundle: Bundle) -> bytes:
    """The gzip tar: the manifest first, then every file (regular, 0600, owned by nobody)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        members = {MANIFEST_NAME: msgspec.json.format(msgspec.json.encode(bundle.manifest), indent=2) + b"\n",
                   **bundle.contents}
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, int(bundle.manifest.created_at)
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=int(bundle.manifest.created_at)) as gz:
        gz.write(raw.getvalue())
    data = out.getvalue()
    if len(data) > MAX_BUNDLE_BYTES or len(raw.getvalue()) > MAX_CONTENT_BYTES:
        # Never write a bundle `machine join` would refuse.
        raise BundleError(f"the bundle would be {len(data)} bytes ({len(raw.getvalue())} unpacked), over what a "
                          f"join accepts ({MAX_BUNDLE_BYTES}, {MAX_CONTENT_BYTES} unpacked)")
    return data


# --- reading one --------------------------------------------------------------------------------


def check_content(entry: Entry, data: bytes) -> None:
    """Each file is what its name says, so a bundle cannot smuggle, say, a private key as a
    certificate or an operator credential as a gateway's."""
    where = entry.path
    try:
        if where.endswith(".nk"):
            nkeys.from_seed(data.strip())
        elif where.endswith(".creds"):
            principal = principal_from_tags(list(jwt.decode(parse_creds(data.decode())[0])
                                                 .get("nats", {}).get("tags") or []))
            if principal is None or principal.role is not entry.issue_as:
                raise BundleError(f"{where} is not a {entry.issue_as} credential")
        elif where.endswith(".pem"):
            if b"PRIVATE KEY" in data:
                raise BundleError(f"{where} holds a private key: a bundle never carries one")
            x509.load_pem_x509_certificate(data)
        elif where.endswith(".token"):
            text = data.decode().strip()
            if not text or not text.isprintable() or len(text) > 512:
                raise BundleError(f"{where} is not a token")
        elif where.endswith(".json") and not isinstance(json.loads(data), dict):
            raise BundleError(f"{where} is not a JSON object")
    except BundleError:
        raise
    except (ValueError, CredentialsError, jwt.JWTError, nkeys.NkeysError, UnicodeDecodeError) as exc:
        raise BundleError(f"{where} is damaged ({type(exc).__name__}: {exc})") from exc


def _gunzip(data: bytes) -> bytes:
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(f"the bundle is over {MAX_BUNDLE_BYTES} bytes: not one `gridctl machine add` wrote")
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
            raw = gz.read(MAX_CONTENT_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError; truncation, EOFError
        raise BundleError(f"not a bundle: not a whole gzip file ({exc})") from exc
    if len(raw) > MAX_CONTENT_BYTES:
        raise BundleError(f"the bundle unpacks to over {MAX_CONTENT_BYTES} bytes: not one `gridctl machine add` wrote")
    return raw


def _kind(info: tarfile.TarInfo) -> str:
    for test, kind in ((info.issym, "a symbolic link"), (info.islnk, "a hard link"), (info.isdir, "a directory"),
                       (info.ischr, "a device"), (info.isblk, "a device"), (info.isfifo, "a FIFO")):
        if test():
            return kind
    return "not a regular file"


def _check_member_name(name: str) -> None:
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts) \
            or PurePosixPath(name).is_absolute():
        raise BundleError(f"member {name!r} is not a plain relative path (absolute, '..' or empty parts)")


def _members(raw: bytes) -> dict[str, bytes]:
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            infos = tar.getmembers()
            if len(infos) > MAX_MEMBERS:
                raise BundleError(f"the bundle has {len(infos)} members, more than any role carries")
            members: dict[str, bytes] = {}
            for info in infos:
                if not info.isreg():
                    raise BundleError(f"member {info.name!r} is {_kind(info)}: a bundle holds regular files only")
                _check_member_name(info.name)
                if info.name in members:
                    raise BundleError(f"member {info.name!r} appears twice")
                handle = tar.extractfile(info)
                data = handle.read() if handle is not None else b""
                if len(data) != info.size:
                    raise BundleError(f"member {info.name!r} is cut short: the bundle is truncated")
                members[info.name] = data
    except tarfile.TarError as exc:
        raise BundleError(f"not a bundle: the archive inside is damaged or truncated ({exc})") from exc
    return members


def _manifest(data: bytes | None) -> Manifest:
    if data is None:
        raise BundleError(f"the bundle has no {MANIFEST_NAME}")
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise BundleError(f"{MANIFEST_NAME} is not JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise BundleError(f"{MANIFEST_NAME} is not a JSON object")
    if value.get("version") != BUNDLE_VERSION:
        raise BundleError(f"bundle format version {value.get('version')!r} is not one this gridctl reads "
                          f"({BUNDLE_VERSION}): make the bundle with the same Grid version")
    if value.get("role") not in ROLE_CONTENTS:
        raise BundleError(f"unknown role {value.get('role')!r} in {MANIFEST_NAME}: one of {', '.join(ROLE_CONTENTS)}")
    try:
        manifest = msgspec.convert(value, Manifest)
    except msgspec.ValidationError as exc:
        raise BundleError(f"{MANIFEST_NAME}: {exc}") from exc
    check_name(manifest.name)
    check_urls(manifest.nats_urls, NATS_SCHEMES, "NATS")
    check_urls(manifest.admin_urls, ADMIN_SCHEMES, "admin")
    if not manifest.nats_urls:
        raise BundleError(f"{MANIFEST_NAME} names no NATS URL")
    return manifest


def unpack(data: bytes) -> Bundle:
    """The bundle in `data`, every part checked; BundleError naming the first fault otherwise."""
    members = _members(_gunzip(data))
    manifest = _manifest(members.pop(MANIFEST_NAME, None))
    role = manifest.role
    listed = [f.path for f in manifest.files]
    if len(set(listed)) != len(listed):
        raise BundleError(f"{MANIFEST_NAME} lists a file twice")
    unlisted = sorted(set(members) - set(listed))
    if unlisted:
        raise BundleError(f"member {unlisted[0]!r} is not listed in {MANIFEST_NAME}")
    contents: dict[str, bytes] = {}
    for record in manifest.files:
        entry = entry_for(role, record.path)
        if entry is None:
            raise BundleError(f"{record.path!r} is not a file a {role} bundle carries")
        if record.path not in members:
            raise BundleError(f"{record.path} is listed in {MANIFEST_NAME} but missing: the bundle is incomplete")
        data = members[record.path]
        if len(data) != record.size or hashlib.sha256(data).hexdigest() != record.sha256:
            raise BundleError(f"{record.path} does not match its sha256 in {MANIFEST_NAME}: the bundle is damaged")
        check_content(entry, data)
        contents[record.path] = data
    for entry in ROLE_CONTENTS[role]:
        if entry.required and entry.path not in contents:
            raise BundleError(f"a {role} bundle must carry {entry.path}, and this one does not")
    return Bundle(manifest, contents, {})


def read_bundle(path: Path) -> Bundle:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BUNDLE_BYTES + 1)
    except OSError as exc:
        raise BundleError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return unpack(data)


# --- installing one -----------------------------------------------------------------------------


def conflicts(bundle: Bundle, home: Path) -> list[Path]:
    """What installing would replace: the bundle's files, machine.json, or an authority (a home
    that holds one is a controller's, whatever this bundle is)."""
    home = Path(home)
    candidates = [_identity("account.nk"), MACHINE_FILE, *bundle.contents]
    return [home / p for p in dict.fromkeys(candidates) if (home / p).is_symlink() or (home / p).exists()]


def install(bundle: Bundle, home: Path, *, now: float) -> MachineRecord:
    """Write the bundle's files and machine.json under `home`: directories 0700, files 0600,
    the home itself made owner-only (an existing wider one is tightened, with a warning)."""
    config = GridConfig(home=Path(home), nats_url=None)
    config.ensure_home()
    for relative, data in bundle.contents.items():
        target = config.home / relative
        directory = config.home
        for part in PurePosixPath(relative).parent.parts:  # each level 0700 (mkdir parents= would not)
            directory = ensure_private_dir(directory / part)
        write_owner_only(target, data)
    m = bundle.manifest
    record = MachineRecord(version=BUNDLE_VERSION, role=m.role, name=m.name, nats_urls=m.nats_urls,
                           admin_urls=m.admin_urls, files=tuple(bundle.contents), bundle_created_at=m.created_at,
                           joined_at=now)
    write_owner_only(config.machine_file, msgspec.json.format(msgspec.json.encode(record), indent=2) + b"\n")
    return record


def write_bundle(path: Path, data: bytes, *, force: bool) -> None:
    """Write `data` to `path` owner-only; an existing file (or link) only with `force`."""
    path = Path(path)
    if path.is_dir():
        raise BundleError(f"{path} is a directory: name the bundle file")
    if (path.exists() or path.is_symlink()) and not force:
        raise BundleError(f"{path} exists: pass --force to replace it")
    try:
        write_owner_only(path, data)
    except OSError as exc:
        raise BundleError(f"cannot write {path}: {exc.strerror or exc}") from exc
