"""Which ports `gridctl up` listens on: a port the user named is used or refused, never swapped.

Every client of a grid finds its gateway (and admin API, dashboard, NATS listener) at the port
it was told. Moving a listener the user named to another port strands all of them without a
word, so such a port is checked before anything starts and, when something really listens on
it, `gridctl up` stops with the port and its holder named. Only a port the user left unnamed
(the gateway's default 8080) is replaced by a free one, and that is said.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from grid.transport.embedded import port_in_use

# The gateway's port when --port is not given; another is chosen when this one is taken.
DEFAULT_GATEWAY_PORT = 8080


@dataclass(frozen=True)
class NamedPort:
    """A port the user asked for, by the option that named it."""

    option: str  # e.g. "--port"
    host: str
    port: int  # 0: none named (a free one is picked by the listener itself)


@dataclass(frozen=True)
class PortRefusal:
    option: str
    host: str
    port: int
    holder: str | None  # "pid 1234 (nginx)", or None when this user cannot see who it is

    @property
    def message(self) -> str:
        who = f"in use by {self.holder}" if self.holder else "already in use"
        return (f"port {self.port} on {self.host} ({self.option}) is {who}; stop that process, or choose "
                f"another port with {self.option} (0 picks a free one)")


def port_holder(port: int) -> str | None:
    """Who listens on `port`, as far as this user may see (other users' processes show no pid)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
            except psutil.Error:
                return f"pid {conn.pid}"
    return None


def first_taken(named: Sequence[NamedPort], in_use: Callable[[int, str], bool] = port_in_use) -> PortRefusal | None:
    """The first named port a listener could not bind now, or None when every one is free."""
    for want in named:
        if want.port and in_use(want.port, want.host):
            return PortRefusal(want.option, want.host, want.port, port_holder(want.port))
    return None


def gateway_port(host: str, requested: int | None, notify: Callable[[str], None],
                 in_use: Callable[[int, str], bool] = port_in_use) -> int:
    """The gateway's port: the one named (checked with `first_taken`), else the default when it
    is free, else 0 (a free one)."""
    if requested is not None:
        return requested
    if not in_use(DEFAULT_GATEWAY_PORT, host):
        return DEFAULT_GATEWAY_PORT
    notify(f"port {DEFAULT_GATEWAY_PORT} is taken; the gateway will use a free port "
           f"(name one with --port to have it used or refused)")
    return 0
