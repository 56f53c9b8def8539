"""A small tmpfs mounted for a test that needs a disk it can fill or find too small (root only)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def mount_tmpfs(path: Path, size_mib: int) -> None:
    """Create `path` (owner-only) and mount a tmpfs of `size_mib` MiB on it."""
    path.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(path)], check=True)


def unmount(path: Path) -> None:
    for _ in range(50):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.2)  # a process may still be closing files there
    subprocess.run(["umount", "-l", str(path)], check=True)
