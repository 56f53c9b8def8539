"""One allocator for the port blocks tests hand to processes that choose ports inside them: an
agent's engine ports (`port_range`, `--port-range`), a test fleet's `--engine-port-base`, the
consecutive ports of a NATS cluster.

Fixed blocks written into test files overlapped between files, so an engine one test left
behind (adopted or orphaned children outlive their agent by design) or a second test session on
the same machine could hold a port another test expected to be free. Blocks here:

- lie below the kernel's ephemeral range, so no port picked by binding port 0 (`free_port()`,
  the source port of an outgoing connection) ever falls inside one;
- never overlap within a session, and the first one starts at an offset derived from the
  process id, so concurrent sessions on one machine start far apart;
- are free on every interface when handed out (each port is bound once to check).
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

LOWEST = 10_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL_START = 32_768  # the kernel's default, where the file above is absent
# The agent's default engine block is a hundred ports; tests that start one agent need a few.
ENGINE_PORT_COUNT = 50

_lock = threading.Lock()
_cursor: int | None = None


def _ceiling() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LINUX_EPHEMERAL_START


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def port_block(count: int) -> int:
    """The first of `count` consecutive ports, all free now and never handed out before in
    this session."""
    global _cursor
    ceiling = _ceiling()
    span = ceiling - LOWEST
    if not 0 < count < span // 4:
        raise ValueError(f"a block of {count} ports does not fit below {ceiling}")
    with _lock:
        if _cursor is None:
            _cursor = LOWEST + (os.getpid() * 997) % (span - count)
        for _ in range(span // count + 1):
            base = _cursor if _cursor + count <= ceiling else LOWEST
            _cursor = base + count
            if all(_free(base + i) for i in range(count)):
                return base
    raise RuntimeError(f"no {count} consecutive free ports between {LOWEST} and {ceiling}")


def engine_ports(count: int = ENGINE_PORT_COUNT) -> tuple[int, int]:
    """An agent's engine port range, first and last port included (AgentOptions.port_range)."""
    base = port_block(count)
    return base, base + count - 1


def engine_ports_arg(count: int = ENGINE_PORT_COUNT) -> str:
    """The same as the `--port-range LO-HI` value of `gridctl node start` and `gridctl up`."""
    lo, hi = engine_ports(count)
    return f"{lo}-{hi}"


def fleet_engine_port_base(machines: int) -> int:
    """A `gridctl test start --engine-port-base` for `machines` hosts (one block of
    grid.testfleet's ENGINE_PORT_SPAN ports per host, and the room it checks for)."""
    from grid.testfleet.fleet import ENGINE_PORT_SPAN

    return port_block(ENGINE_PORT_SPAN * (machines + 1))
