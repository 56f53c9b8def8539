"""Named machines for a README walk: one Linux network namespace per machine, all on one bridge,
each name resolvable from every other (as DNS would on a real network).

Only objects named with the `grids` prefix and addresses inside 10.215.0.0/24 are made, and only
those this module made are removed (a different prefix and subnet from grid.testfleet.netns, so a
test fleet and a README walk never touch each other's objects). Names resolve through
/etc/netns/<namespace>/hosts, which `ip netns exec` mounts over /etc/hosts for what runs inside.
Removing a machine first kills every process still in its namespace: a README walk leaves
nothing running.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

PREFIX = "grids"
BRIDGE = f"{PREFIX}-br0"
SUBNET = ipaddress.ip_network("10.215.0.0/24")
BRIDGE_ADDRESS = str(SUBNET.network_address + 1)
FIRST_OFFSET = 10  # machine i (0-based) gets 10.215.0.(10 + i)
NETNS_ETC = Path("/etc/netns")


class MachineError(RuntimeError):
    """A namespace, link or hosts file could not be made; the message says which."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([shutil.which("ip") or "ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise MachineError(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


def unavailable_reason() -> str | None:
    """Why machines cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if _ip("link", "show", BRIDGE, check=False).returncode == 0:
        return f"the bridge {BRIDGE} already exists (another README walk, or one left behind: `ip link del {BRIDGE}`)"
    return None


class Machines:
    """Namespaces for `names`, made on enter and removed (with every process in them) on exit."""

    def __init__(self, names: Sequence[str]) -> None:
        if len(names) > 200:
            raise ValueError("at most 200 machines")
        self.names = list(names)
        self.address = {n: str(SUBNET.network_address + FIRST_OFFSET + i) for i, n in enumerate(self.names)}
        self._made_namespaces: list[str] = []
        self._made_links: list[str] = []
        self._bridge = False

    @staticmethod
    def namespace(name: str) -> str:
        return f"{PREFIX}-{name}"

    def exec_prefix(self, name: str) -> list[str]:
        return [shutil.which("ip") or "ip", "netns", "exec", self.namespace(name)]

    def __enter__(self) -> Machines:
        try:
            self._make()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _make(self) -> None:
        _ip("link", "add", BRIDGE, "type", "bridge")
        self._bridge = True
        _ip("addr", "add", f"{BRIDGE_ADDRESS}/{SUBNET.prefixlen}", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in self.address.items())
        for i, name in enumerate(self.names):
            ns = self.namespace(name)
            outer, inner = f"{PREFIX}-v{i}", f"{PREFIX}-p{i}"
            _ip("netns", "add", ns)
            self._made_namespaces.append(ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            self._made_links.append(outer)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "master", BRIDGE)
            _ip("link", "set", outer, "up")
            _ip("-n", ns, "addr", "add", f"{self.address[name]}/{SUBNET.prefixlen}", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts)

    def pids(self, name: str) -> list[int]:
        out = _ip("netns", "pids", self.namespace(name), check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    def kill_all(self, name: str, grace: float = 5.0) -> None:
        """SIGTERM every process in the machine's namespace, SIGKILL what is left after `grace`."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
            pids = self.pids(name)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while self.pids(name) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not self.pids(name):
                return

    def remove(self) -> None:
        for ns in self._made_namespaces:
            name = ns[len(PREFIX) + 1:]
            self.kill_all(name)
        for link in self._made_links:
            _ip("link", "del", link, check=False)
        for ns in self._made_namespaces:
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        if self._bridge:
            _ip("link", "del", BRIDGE, check=False)
        self._made_namespaces, self._made_links, self._bridge = [], [], False
