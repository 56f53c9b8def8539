"""The certificate cluster nodes present to each other on their routes (mutual TLS).

A route is both a server (it accepts) and a client (it dials), and nats-server verifies the
dialing node's certificate against the CA: the route certificate therefore carries both the
server and the client extended key usage, unlike the client-port certificate (grid.identity.tls).
It is issued by the same private CA and kept beside it, owner-only.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from grid.identity.tls import SERVER_VALIDITY, TLSMaterial, _key, _pem_key, _san
from grid.secrets import write_owner_only

ROUTE_CERT = "route.pem"
ROUTE_KEY = "route.key"


def route_cert_paths(tls: TLSMaterial) -> tuple[Path, Path]:
    return tls.directory / ROUTE_CERT, tls.directory / ROUTE_KEY


def ensure_route_cert(tls: TLSMaterial, names: Sequence[str], *, now: dt.datetime) -> tuple[Path, Path]:
    """A route certificate for `names` (every node's host), issued once and re-issued when it
    expires within 30 days or misses a name. `tls.ensure` must have made the CA."""
    cert_path, key_path = route_cert_paths(tls)
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        have = {str(v) for v in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(x509.DNSName))
        if cert.not_valid_after_utc - now > dt.timedelta(days=30) and set(names) <= have:
            return cert_path, key_path
    ca_key = serialization.load_pem_private_key((tls.directory / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(tls.ca_cert.read_bytes())
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "grid cluster route")]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + SERVER_VALIDITY)
        .add_extension(_san(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    write_owner_only(key_path, _pem_key(key))
    write_owner_only(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def route_tls_config(cert: Path, key: Path, ca: Path) -> str:
    """The routes' `tls` block: each node proves itself with a CA-issued route certificate."""
    return (
        "tls {\n"
        f"  cert_file: \"{cert}\"\n"
        f"  key_file: \"{key}\"\n"
        f"  ca_file: \"{ca}\"\n"
        "  verify: true\n"
        "  timeout: 2\n"
        "}\n"
    )
