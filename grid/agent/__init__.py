"""The Grid host agent: actuates Grid-owned llama.cpp children and protects the local host."""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use, not with the package: the small processes that run one part of the agent
# (the engines' warden, grid.agent.warden; the xllamacpp engine wrapper) would otherwise load the
# whole agent, its NATS and HTTP stacks included, some 20 MB more in each of them.
_EXPORTS = {
    "AgentOptions": "grid.agent.options",
    "HostAgent": "grid.agent.service",
    "BUNDLED_MODEL_ID": "grid.agent.artifacts",
    "BUNDLED_SHA256": "grid.agent.artifacts",
    "ensure_bundled_model": "grid.agent.artifacts",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
