"""Grid: an event-sourced control plane for placing AI models on a mixed fleet."""

__version__ = "0.1.0"
