"""How one host agent runs: identity hints, capacity, intervals, deadlines and its port range."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

from grid.agent.engines import llama_cpp
from grid.agent.protection import ProtectionPolicy


@dataclass
class AgentOptions:
    host_id: str | None = None
    capacity_mb: int | None = None
    reserved_mb: int = 0
    failure_domain: str = "default"
    tags: tuple[str, ...] = ()
    port_range: tuple[int, int] = (38000, 38999)
    heartbeat_interval: float = 2.0
    sample_interval: float = 2.0
    # How long one pull for the next command lasts. Not a bound on pickup latency: a pull for one
    # message returns as soon as a command arrives, and a reconnect ends the pull at once
    # (grid.transport.jetstream_consumers). Each pull costs the idle agent a round trip to the
    # server (at 0.2 s, five a second were the largest part of its idle CPU); its length bounds
    # only how long a pull the server dropped without answering goes unnoticed.
    command_poll_seconds: float = 5.0
    state_dir: Path | None = None
    # --runtime-binary: a llama-server path or "xllamacpp" (grid.agent.engines.runtime); None: auto.
    llama_server: Path | str | None = None
    threads: int = llama_cpp.DEFAULT_THREADS
    ready_timeout: float = 60.0
    drain_deadline: float = 60.0
    drain_poll: float = 0.2
    stop_term_timeout: float = 10.0
    stop_kill_timeout: float = 5.0
    policy: ProtectionPolicy = field(default_factory=ProtectionPolicy)
    hostname: str = field(default_factory=socket.gethostname)
    # The host's NATS credential (.creds), when the server has auth on: it names the command
    # consumer the controller made for this host, and is renewed before it expires.
    credentials: Path | None = None
    data_tier: str = "internal"
    # Loopback /metrics listener (grid.agent.http): 0 = a free port, None = no listener.
    http_port: int | None = 0
