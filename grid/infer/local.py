"""In-process responders: the hop a request skips when the gateway and the chosen host's agent
share one process (`gridctl up`).

The requester (grid.infer.client) looks the host up here before publishing. Found, the request
is handed to that host's own `InferenceResponder` as the same signed message NATS would have
delivered, and its answer lands in the requester's same inbox as the same numbered messages:
admission, the engine-key boundary (the key is added by the responder, never seen by the
gateway), cancellation, streaming, errors, slot release and disconnect handling are the NATS
path's own code. Only the broker traversals (two per request, more per streamed answer) go.
Not found (another process or machine, or the agent's responder is stopped), NATS is the path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class ReplySink(Protocol):
    """Where a responder puts the messages of one in-process answer (the requester's inbox)."""

    def put(self, msg: Any) -> None: ...


class LocalPort(Protocol):
    """What an in-process responder offers a requester: take a request, cancel one. Nothing
    else (no engine route, no key) is reachable through it."""

    async def deliver(self, msg: Any, sink: ReplySink) -> None: ...

    def cancel(self, reply: str) -> None: ...


class LocalResponders:
    """Responders in this process by host id. Each entry is a function returning the host's
    port, or None while its responder is not serving (then requests go over NATS)."""

    def __init__(self) -> None:
        self._ports: dict[str, Callable[[], LocalPort | None]] = {}

    def add(self, host_id: str, port: Callable[[], LocalPort | None]) -> None:
        self._ports[host_id] = port

    def remove(self, host_id: str) -> None:
        self._ports.pop(host_id, None)

    def get(self, host_id: str) -> LocalPort | None:
        port = self._ports.get(host_id)
        return port() if port is not None else None
