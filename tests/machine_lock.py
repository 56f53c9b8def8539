"""Turns at a resource one machine has only one of, for tests run in parallel workers (pytest-xdist)
or by two sessions at once.

Test fleets in network namespaces all use one bridge and one subnet (`grid.testfleet.netns`), and
`gridctl test start --netns` refuses while another fleet holds them. A test that starts such a
fleet waits for its turn here instead of failing.
"""

from __future__ import annotations

import contextlib
import fcntl
import tempfile
from collections.abc import Iterator
from pathlib import Path

NETNS_FLEET = "grid-tests-netns-fleet"


@contextlib.contextmanager
def turn(resource: str) -> Iterator[None]:
    """Hold `resource` until the block ends; another process waits. The kernel drops the lock with
    the process, so a test killed mid-turn leaves nothing to clean."""
    path = Path(tempfile.gettempdir()) / f"{resource}.lock"
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
