"""A complete one-machine grid in one event loop: the composition behind `gridctl up`.

Embedded NATS JetStream (unless a URL is given), the controller with its admin API, the
OpenAI-compatible gateway and a local host agent. Stopping drains and unloads the agent's
children after the controller has stopped issuing commands.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from grid.config import GridConfig
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ModeSet, ProfileSet
from grid.events.embedded import EmbeddedNats
from grid.events.jetstream import JetStreamLog

# Resident budget for the bundled 135M Q4_1 model with a 2k context (the file is 94 MiB).
BUNDLED_MEMORY_MB = 512


def bundled_profile(**overrides: Any) -> ModelProfile:
    from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256

    fields: dict[str, Any] = dict(
        model_id=BUNDLED_MODEL_ID,
        memory_mb=BUNDLED_MEMORY_MB,
        artifact_sha256=BUNDLED_SHA256,
        min_replicas=1,
        max_replicas=1,
        workload_scores={"general": 0.6, "coding": 0.3, "research": 0.3, "marketing": 0.4, "sales": 0.4},
        expected_service_seconds=1.0,
        load_seconds=2.0,
        warm_seconds=3.0,
        min_residency_seconds=60.0,
    )
    fields.update(overrides)
    return ModelProfile(**fields)


class LocalGrid:
    def __init__(
        self,
        config: GridConfig,
        *,
        nats_url: str | None = None,
        mode: str = "automatic",
        profile: ModelProfile | None = None,
        gateway_host: str = "127.0.0.1",
        gateway_port: int = 0,
        admin_port: int = 0,
        agent_options: Any = None,
        controller_settings: Any = None,
    ) -> None:
        self.config = config
        self.nats_url = nats_url
        self.mode = mode
        self.profile = profile if profile is not None else bundled_profile()
        self.gateway_host = gateway_host
        self.gateway_port = gateway_port
        self.admin_port = admin_port
        self.agent_options = agent_options
        self.controller_settings = controller_settings
        self.embedded: EmbeddedNats | None = None
        self.log: JetStreamLog | None = None
        self.controller: Any = None
        self.gateway: Any = None
        self.agent: Any = None
        self.admin: Any = None
        self.admin_url = ""

    @property
    def gateway_url(self) -> str:
        return self.gateway.url if self.gateway is not None else ""

    async def start(self) -> "LocalGrid":
        from grid.agent.service import AgentOptions, HostAgent
        from grid.controller.api import serve_admin
        from grid.controller.service import Controller
        from grid.gateway.app import create_gateway_app, start_gateway

        cfg = self.config
        cfg.ensure_home()
        if self.nats_url is None:
            # Started from this (the main) thread: the server dies with it (see embedded.py).
            self.embedded = EmbeddedNats(cfg.nats_store_dir)
            self.embedded.start()
            self.nats_url = self.embedded.url
        cfg.nats_url_file.write_text(self.nats_url + "\n")
        self.log = await JetStreamLog.connect(self.nats_url, name="grid-local")

        self.controller = Controller(self.log, cfg, settings=self.controller_settings)
        await self.controller.start()
        self.admin = await serve_admin(self.controller, "127.0.0.1", self.admin_port)
        self.admin_url = self.admin.url or ""
        # Profile and mode travel through the log like any operator's change.
        catalog = self.controller.runner["catalog"]
        if catalog.profiles.get(self.profile.model_id) is None:
            await self.log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=self.profile))
        if catalog.mode != self.mode:
            await self.log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode=self.mode))  # type: ignore[arg-type]

        self.gateway = await start_gateway(create_gateway_app(self.log, cfg), self.gateway_host, self.gateway_port)
        options = self.agent_options or AgentOptions(failure_domain="local", tags=("local",))
        self.agent = HostAgent(self.log, cfg, options)
        await self.agent.start()
        return self

    def residency_state(self, model_id: str) -> str | None:
        hb = getattr(self.agent, "last_heartbeat", None)
        if hb is None:
            return None
        return {r.model_id: r.state for r in hb.residencies}.get(model_id)

    async def stop(self) -> None:
        # Controller first: nothing may re-warm what the agent is draining.
        if self.admin is not None:
            with contextlib.suppress(Exception):
                await self.admin.stop()
        if self.controller is not None:
            with contextlib.suppress(Exception):
                await self.controller.stop()
        if self.agent is not None:
            with contextlib.suppress(Exception):
                await self.agent.stop(drain=True)
        if self.gateway is not None:
            with contextlib.suppress(Exception):
                await self.gateway.stop()
        if self.log is not None:
            with contextlib.suppress(Exception):
                await self.log.close()
        if self.embedded is not None:
            self.embedded.stop()
            with contextlib.suppress(OSError):
                self.config.nats_url_file.unlink()
