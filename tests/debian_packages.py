"""Debian packages a test needs and pip cannot install (a browser, an X server).

On a Debian machine where the suite runs as root (CI here) the test installs the distribution
packages once; elsewhere a missing tool is a failure that says what to install, never a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

import pytest


def require_debian_tool(find: Callable[[], str | None], packages: tuple[str, ...], missing: str) -> str:
    """The path `find` returns, after installing `packages` with apt-get when it returns None
    and this process may; `pytest.fail(missing)` when the tool is still not there."""
    path = find()
    if path is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], env=env, check=False, timeout=600,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], env=env,
                       check=False, timeout=900, stdout=subprocess.DEVNULL)
        path = find()
    if path is None:
        pytest.fail(missing)
    return path
