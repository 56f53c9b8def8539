"""The Grid host agent: actuates Grid-owned llama.cpp children and protects the local host."""

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256, ensure_bundled_model
from grid.agent.options import AgentOptions
from grid.agent.service import HostAgent

__all__ = ["AgentOptions", "HostAgent", "BUNDLED_MODEL_ID", "BUNDLED_SHA256", "ensure_bundled_model"]
