"""Engine children seen as processes, whichever llama.cpp runtime runs them.

The native runtime's process is named `llama-server`; the xllamacpp runtime's is a Python
interpreter. What every engine an agent spawns carries is the agent's ownership marker in its
environment (grid.agent.ownership), so that is what identifies one here.
"""

from __future__ import annotations

import psutil

from grid.agent.engines.runtime import XLLAMACPP, Runtime
from grid.agent.ownership import OWNER_ENV


def is_engine(proc: psutil.Process) -> bool:
    """Whether `proc` is an engine child an agent started (False once it is gone)."""
    try:
        return OWNER_ENV in proc.environ()
    except psutil.Error:
        return False


def runtime_arg(runtime: Runtime) -> str:
    """The `--runtime-binary` value that names `runtime`, for a process started without the
    session's environment."""
    return XLLAMACPP if runtime.name == XLLAMACPP else runtime.command[0]
