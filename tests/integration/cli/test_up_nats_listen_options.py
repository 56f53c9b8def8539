"""`gridctl up --nats-listen` refuses what it cannot serve before starting anything, the embedded
server's TLS names loopback beside the names asked for, and the include forms `gridctl nats
init` prints are the ones a real nats-server accepts."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from grid.localgrid import embedded_tls
from grid.transport.embedded import find_nats_server

GRIDCTL = [sys.executable, "-m", "grid.cli.main"]


def _gridctl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    env.pop("GRID_NATS_URL", None)
    return subprocess.run([*GRIDCTL, *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("args", "said"), [
    (("--nats-listen", "0.0.0.0:4222"), "--nats-tls-name"),
    (("--nats-listen", "grid.example.lan"), "HOST:PORT"),
    (("--nats-listen", "10.1.2.3:99999"), "HOST:PORT"),
    (("--nats-tls-name", "grid.example.lan"), "needs --nats-listen"),
    (("--nats", "nats://127.0.0.1:4222", "--nats-listen", "0.0.0.0:4222", "--nats-tls-name", "a"), "gridctl nats init --listen"),
])
def test_up_refuses_a_listener_it_cannot_serve(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    done = _gridctl(tmp_path / "home", "up", "--no-wait", *args)
    assert done.returncode != 0
    assert said in " ".join(done.stderr.split()), done.stderr
    assert not (tmp_path / "home" / "up.pid").exists()


def test_embedded_tls_is_off_on_loopback_and_names_loopback_elsewhere(tmp_path: Path) -> None:
    assert embedded_tls(tmp_path, "127.0.0.1", ()) is None
    material = embedded_tls(tmp_path, "0.0.0.0", ("grid.example.lan", "10.1.2.3"))
    assert material is not None
    cert = x509.load_pem_x509_certificate(material.server_cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(map(str, names.get_values_for_type(x509.IPAddress))) == {"10.1.2.3", "127.0.0.1"}
    assert set(names.get_values_for_type(x509.DNSName)) == {"grid.example.lan", "localhost"}
    assert cert.not_valid_after_utc > dt.datetime.now(dt.timezone.utc)
    # The CA is the grid's own, where `gridctl invite` and the join reply find it.
    assert material.ca_cert == tmp_path / "identity" / "tls" / "ca.pem"


def test_nats_init_prints_include_forms_nats_server_accepts(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    done = _gridctl(tmp_path / "home", "nats", "init", "--tls-name", "nats", "--server-dir", str(etc / "grid"))
    assert done.returncode == 0, done.stderr
    printed = " ".join(done.stdout.split())
    assert f"server config snippet: {etc / 'grid' / 'grid-nats.conf'}" in printed
    assert "`include grid-nats.conf` beside it" in printed
    assert f"`include grid/grid-nats.conf` from {etc}" in printed
    nats_server = str(find_nats_server())
    for config, line in ((etc / "grid" / "beside.conf", "include grid-nats.conf"),
                         (etc / "above.conf", "include grid/grid-nats.conf")):
        config.write_text(f"listen: 127.0.0.1:4222\n{line}\n")
        check = subprocess.run([nats_server, "-c", str(config), "-t"], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, (line, check.stdout + check.stderr)
