"""The OpenAI-compatible gateway: routing, breaker, affinity, telemetry and the proxy app."""
