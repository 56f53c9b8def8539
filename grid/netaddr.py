"""Whether a listen address or host name stays on this machine.

Listeners that may run unguarded on loopback only (the gateway without client keys, the
dashboard without a token, the embedded NATS server without TLS) ask `is_loopback` about the
host they were told to bind, so a host counts as loopback the same way for each of them.
"""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for `localhost` in any case, an IPv4 address in 127.0.0.0/8, and `::1` with or
    without brackets (also an IPv4-mapped 127.x address, `::ffff:127.0.0.1`, and a scoped
    `::1%lo`).

    Any other name is not loopback: the resolver decides where it points at bind time, and
    /etc/hosts or DNS may send it anywhere, so without resolving it (I/O whose answer can
    change) the only safe answer is "reachable by others". That includes `localhost.` and
    `*.localhost`. The host is judged exactly as given, the way the listener binds it: no
    whitespace is stripped, and brackets count only as a pair around an IPv6 address. The
    wildcards (`0.0.0.0`, `::`, and the empty host) listen on every interface: not loopback.
    """
    if host.lower() == "localhost":
        return True
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        address = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        return False
    if bracketed and address.version != 6:
        return False  # "[127.0.0.1]" is not an address any listener takes
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        # A dual-stack socket bound to ::ffff:127.x accepts only 127.x; ipaddress in older
        # Pythons (3.11 among them) does not call that loopback itself.
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
