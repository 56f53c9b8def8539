"""How one host agent runs: identity hints, capacity, intervals, deadlines and its port range."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

from grid.agent.engines import llama_cpp
from grid.agent.protection import ProtectionPolicy
from grid.agent.warden import ORPHAN_GRACE_SECONDS


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
    # Bound on command pickup latency: the JetStream pull fetch lingers until its timeout once
    # a batch has started, so the consumer polls with a short timeout.
    command_poll_seconds: float = 0.2
    state_dir: Path | None = None
    # --runtime-binary: a llama-server path or "xllamacpp" (grid.agent.engines.runtime); None: auto.
    llama_server: Path | str | None = None
    threads: int = field(default_factory=llama_cpp.default_threads)
    ready_timeout: float = 60.0
    drain_deadline: float = 60.0
    drain_poll: float = 0.2
    stop_term_timeout: float = 10.0
    stop_kill_timeout: float = 5.0
    # How long engines outlive this agent's death waiting for an agent to adopt them, before its
    # warden stops them (grid.agent.warden).
    orphan_grace: float = ORPHAN_GRACE_SECONDS
    policy: ProtectionPolicy = field(default_factory=ProtectionPolicy)
    # Joined with a `--dedicated` invitation (True) or without (False, an employee machine); None:
    # not joined by invitation. Reported on heartbeats (HostHeartbeat.use) for status.
    dedicated: bool | None = None
    hostname: str = field(default_factory=socket.gethostname)
    # The host's NATS credential (.creds), when the server has auth on: it names the command
    # consumer the controller made for this host, and is renewed before it expires.
    credentials: Path | None = None
    data_tier: str = "internal"
    # Loopback /metrics listener (grid.agent.http): 0 = a free port, None = no listener.
    http_port: int | None = 0
