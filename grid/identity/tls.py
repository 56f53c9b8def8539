"""A private CA and the NATS server's certificate, and the fingerprint a join token pins.

A joining machine has nothing to trust yet, so its token carries the sha256 fingerprint of the
server's certificate. `fetch_server_certificate` reads that certificate the way a NATS client
meets it (the server's INFO line in clear, then the TLS handshake), `pinned_tls_context` trusts
exactly that certificate if the fingerprint matches, and the join reply then delivers the CA,
which the host keeps for every later connection (a re-issued server certificate keeps working).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import socket
import ssl
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from grid.secrets import write_owner_only

CA_VALIDITY = dt.timedelta(days=3650)
SERVER_VALIDITY = dt.timedelta(days=397)
FINGERPRINT_PREFIX = "sha256:"


class TLSMaterialError(RuntimeError):
    pass


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def fingerprint(cert_pem: bytes) -> str:
    der = x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER)
    return FINGERPRINT_PREFIX + hashlib.sha256(der).hexdigest()


def _der_fingerprint(der: bytes) -> str:
    return FINGERPRINT_PREFIX + hashlib.sha256(der).hexdigest()


def _san(names: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


class TLSMaterial:
    """ca.pem/ca.key and server.pem/server.key under one owner-only directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    def ensure(self, names: Sequence[str], *, now: dt.datetime) -> "TLSMaterial":
        """Create the CA once, and a server certificate for `names` (hostnames or IPs) if the
        current one is missing, expiring within 30 days, or does not cover every name."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.directory.chmod(0o700)
        ca_key_path = self.directory / "ca.key"
        if not (self.ca_cert.exists() and ca_key_path.exists()):
            key = _key()
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Grid private CA")])
            cert = (
                x509.CertificateBuilder()
                .subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + CA_VALIDITY)
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256())
            )
            write_owner_only(ca_key_path, _pem_key(key))
            write_owner_only(self.ca_cert, cert.public_bytes(serialization.Encoding.PEM))
        if self._server_cert_current(names, now):
            return self
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        key = _key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + SERVER_VALIDITY)
            .add_extension(_san(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        )
        write_owner_only(self.server_key, _pem_key(key))
        write_owner_only(self.server_cert, cert.public_bytes(serialization.Encoding.PEM))
        return self

    def _server_cert_current(self, names: Sequence[str], now: dt.datetime) -> bool:
        if not (self.server_cert.exists() and self.server_key.exists()):
            return False
        cert = x509.load_pem_x509_certificate(self.server_cert.read_bytes())
        if cert.not_valid_after_utc - now < dt.timedelta(days=30):
            return False
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        covered = {str(v) for v in san.get_values_for_type(x509.IPAddress)}
        covered |= set(san.get_values_for_type(x509.DNSName))
        return all(str(ipaddress.ip_address(n)) in covered if _is_ip(n) else n in covered for n in names)

    def server_fingerprint(self) -> str:
        return fingerprint(self.server_cert.read_bytes())

    def server_config(self) -> str:
        """The nats-server `tls` block (clients must speak TLS on this listener)."""
        return (
            "tls {\n"
            f"  cert_file: \"{self.server_cert}\"\n"
            f"  key_file: \"{self.server_key}\"\n"
            "  timeout: 2\n"
            "}\n"
        )


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def fetch_server_certificate(host: str, port: int, *, timeout: float = 5.0) -> bytes:
    """The DER certificate a NATS server presents (INFO in clear first, then TLS). Unverified:
    only `pinned_tls_context` decides whether to trust it."""
    with socket.create_connection((host, port), timeout=timeout) as raw:
        info = b""
        while not info.endswith(b"\r\n"):
            chunk = raw.recv(4096)
            if not chunk:
                raise TLSMaterialError(f"{host}:{port} closed before its INFO line")
            info += chunk
        if not info.startswith(b"INFO "):
            raise TLSMaterialError(f"{host}:{port} is not a NATS server")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with context.wrap_socket(raw, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    if not der:
        raise TLSMaterialError(f"{host}:{port} presented no certificate")
    return der


def pinned_tls_context(host: str, port: int, expected_fingerprint: str) -> ssl.SSLContext:
    """A client context trusting exactly the server certificate whose fingerprint was pinned."""
    der = fetch_server_certificate(host, port)
    seen = _der_fingerprint(der)
    if seen != expected_fingerprint:
        raise TLSMaterialError(
            f"{host}:{port} presented certificate {seen}, not the pinned {expected_fingerprint}"
        )
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ssl.DER_cert_to_PEM_cert(der))
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context
