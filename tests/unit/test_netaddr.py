"""is_loopback: the one answer to "does this listen address stay on this machine"."""

from __future__ import annotations

import pytest

from grid.netaddr import is_loopback


@pytest.mark.parametrize("host", [
    "localhost", "LOCALHOST", "LocalHost",
    "127.0.0.1", "127.0.0.9", "127.255.255.254", "127.1.2.3",
    "::1", "[::1]", "0:0:0:0:0:0:0:1", "[0:0:0:0:0:0:0:1]", "::1%lo",
    "::ffff:127.0.0.1", "[::ffff:127.0.0.1]",  # 127.x over a dual-stack socket
])
def test_loopback_spellings(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", [
    # Every interface.
    "0.0.0.0", "::", "[::]", "",
    # Other machines' addresses, including the IPv4-mapped form of one.
    "10.1.2.3", "192.168.0.1", "128.0.0.1", "::2", "fe80::1", "::ffff:10.1.2.3",
    # Names the resolver decides: they may point anywhere.
    "gateway.example", "localhost.", "app.localhost", "localhost.example", "127.0.0.1.example",
    # Not what a listener binds: brackets on IPv4, half brackets, whitespace, a port.
    "[127.0.0.1]", "[::1", "::1]", " 127.0.0.1", "localhost ", "127.0.0.1:80", "[::1]:80",
])
def test_everything_else_counts_as_reachable(host: str) -> None:
    assert not is_loopback(host)


def test_the_gateway_dashboard_and_local_grid_share_it() -> None:
    from grid import localgrid
    from grid.dashboard import app as dashboard
    from grid.gateway import settings as gateway

    assert gateway.is_loopback is dashboard.is_loopback is localgrid.is_loopback is is_loopback
