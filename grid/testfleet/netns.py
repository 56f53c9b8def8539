"""Network namespaces for logical hosts: a bridge in the root namespace, one namespace per host.

Only addresses inside 10.213.0.0/24 and only objects named with the `gridt` prefix are used,
and only objects this fixture created (recorded in its state file) are ever removed. Engines
bind loopback inside their namespace, so nothing outside it reaches them; the host's agent
reaches NATS on the bridge address.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections.abc import Sequence

PREFIX = "gridt"
BRIDGE = f"{PREFIX}-br0"
SUBNET = ipaddress.ip_network("10.213.0.0/24")
BRIDGE_ADDRESS = str(SUBNET.network_address + 1)  # 10.213.0.1: NATS listens here
FIRST_HOST_OFFSET = 10  # host i (1-based) gets 10.213.0.(10 + i)
MAX_HOSTS = 32


class NetnsError(RuntimeError):
    """A namespace, veth or the bridge could not be made or removed; the message says which."""


def namespace_name(index: int) -> str:
    return f"{PREFIX}-h{index}"


def veth_names(index: int) -> tuple[str, str]:
    """(bridge side, namespace side); interface names are at most 15 characters."""
    return f"{PREFIX}-v{index}", f"{PREFIX}-p{index}"


def host_address(index: int) -> str:
    if not 1 <= index <= MAX_HOSTS:
        raise ValueError(f"host index {index} outside 1..{MAX_HOSTS}")
    return str(SUBNET.network_address + FIRST_HOST_OFFSET + index)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("ip")
    if binary is None:
        raise NetnsError("the `ip` command (iproute2) is not installed; --netns needs it")
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


def check_available() -> None:
    """Refuse early, with the reason, where namespaces cannot be made (not root, no iproute2),
    or where a bridge of ours already exists (another fleet, or one a crash left behind)."""
    import os

    if os.geteuid() != 0:
        raise NetnsError("--netns needs root (network namespaces and a bridge are created)")
    if _ip("link", "show", BRIDGE, check=False).returncode == 0:
        raise NetnsError(f"the bridge {BRIDGE} already exists: another test fleet uses 10.213.0.0/24 "
                         f"(`gridctl test stop` removes it), or one was left behind (`ip link del {BRIDGE}`)")


def existing_namespaces() -> set[str]:
    out = _ip("netns", "list", check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def create_bridge() -> str:
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{BRIDGE_ADDRESS}/{SUBNET.prefixlen}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    return BRIDGE


def create_host(index: int) -> tuple[str, str, str]:
    """Namespace, veth pair on the bridge, address and loopback for host `index`.
    Returns (namespace, address, bridge-side veth)."""
    ns = namespace_name(index)
    outer, inner = veth_names(index)
    address = host_address(index)
    if ns in existing_namespaces():
        raise NetnsError(f"the network namespace {ns} already exists (`ip netns del {ns}` if nothing uses it)")
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns)
        _ip("link", "set", outer, "master", BRIDGE)
        _ip("link", "set", outer, "up")
        _ip("-n", ns, "addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", inner)
        _ip("-n", ns, "link", "set", inner, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
    except NetnsError:
        remove([ns], [outer], None)  # made just now by this call: nothing is left half built
        raise
    return ns, address, outer


def exec_prefix(namespace: str | None) -> list[str]:
    """The argv prefix that runs a command inside `namespace` (nothing without one)."""
    if namespace is None:
        return []
    return [shutil.which("ip") or "ip", "netns", "exec", namespace]


def remove(namespaces: Sequence[str], veths: Sequence[str], bridge: str | None) -> list[str]:
    """Remove what is named (only our prefix); returns the problems, empty when all went."""
    problems = []
    for name in [*namespaces, *veths, *([bridge] if bridge else [])]:
        if not name.startswith(PREFIX):
            problems.append(f"refused to remove {name!r}: not a {PREFIX} object")
    present = existing_namespaces()
    for veth in veths:
        if veth.startswith(PREFIX) and _ip("link", "show", veth, check=False).returncode == 0:
            done = _ip("link", "del", veth, check=False)
            if done.returncode != 0:
                problems.append(f"veth {veth}: {done.stderr.strip()}")
    for ns in namespaces:
        if ns.startswith(PREFIX) and ns in present:
            done = _ip("netns", "del", ns, check=False)
            if done.returncode != 0:
                problems.append(f"namespace {ns}: {done.stderr.strip()}")
    if bridge and bridge.startswith(PREFIX) and _ip("link", "show", bridge, check=False).returncode == 0:
        done = _ip("link", "del", bridge, check=False)
        if done.returncode != 0:
            problems.append(f"bridge {bridge}: {done.stderr.strip()}")
    return problems
