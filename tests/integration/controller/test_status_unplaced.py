"""`gridctl status` names the heartbeat claims the gateway does not route ("unplaced claims").

A real controller (recommend mode: it records plans, issues nothing) plans against heartbeats in
the real log. A host claiming a model no plan assigns to it, and a host claiming a model the plan
keeps there (the planner takes a ready claim as an incumbent) that no warm ack of that host
confirms, are both listed, in JSON and in the table (through the admin API and gridctl as a child
process), with a warning line naming host and model. The host's own ack of a warm nobody
commanded does not clear its line; the controller's warm command and the host's ack of it do.
"""

from __future__ import annotations

import time
from pathlib import Path

from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import Residency
from grid.transport.jetstream import JetStreamLog

from tests.heartbeats import heartbeat
from tests.integration.agent.agentkit import make_command
from tests.integration.controller.statuskit import serving_controller, status_until
from tests.integration.controller.test_cli_admin import gridctl
from tests.placement import warm_ack

SHA = "ab" * 32


def claim(model: str, sha: str | None = SHA) -> Residency:
    return Residency(model_id=model, memory_mb=300, state="ready", endpoint="http://127.0.0.1:9", max_concurrency=1,
                     artifact_sha256=sha)


async def test_status_lists_claims_the_plan_does_not_assign_or_no_warm_ack_confirms(js_log: JetStreamLog,
                                                                                      tmp_path: Path) -> None:
    async def beat() -> None:
        for host, residencies in (("host-a", (claim("m"),)), ("host-b", (claim("x", None),))):
            await js_log.append(heartbeat(host, *residencies))

    await js_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=ModelProfile(
        model_id="m", memory_mb=300, artifact_sha256=SHA, min_replicas=1)))
    home = tmp_path / "home"
    async with serving_controller(js_log, home, "ctl-unplaced"):
        doc = await status_until(home, beat, lambda d: d["plan"] is not None and len(d["unplaced_claims"]) == 2,
                                 "two unplaced claims after a recorded plan")
        claims = {(c["host_id"], c["model_id"]): c for c in doc["unplaced_claims"]}
        assert claims[("host-b", "x")]["reason"] == "not_in_plan"
        assert claims[("host-a", "m")]["reason"] == "no_warm_ack"  # kept by the plan, confirmed by nothing
        assert claims[("host-a", "m")]["state"] == "ready"
        assert any("unplaced claim: host host-b reports x ready" in w for w in doc["warnings"]), doc["warnings"]
        rc, out, err = await gridctl(home, "status")
        assert rc == 0, err
        assert "m:ready (unplaced claim)" in out and "x:ready (unplaced claim)" in out, out
        assert "unplaced claim: host host-a reports m ready" in err and "(no_warm_ack)" in err, err

        # A warm ack the host wrote for a command nobody issued (what a hostile host could sign on
        # its own subject) corroborates nothing: the plan does not list the pair.
        await js_log.append(warm_ack("host-a", "m", action_id="made-up"))
        doc = await status_until(home, beat,
                                 lambda d: {c["reason"] for c in d["unplaced_claims"]} == {"not_in_plan",
                                                                                             "not_corroborated"},
                                 "host-a's self-made ack seen and not trusted")
        # The controller's own warm command, acknowledged by the host (as an agent does after
        # running it), corroborates the claim once the next plan lists it.
        await js_log.append(make_command(action_id="warm-1", kind="warm", host_id="host-a", model_id="m"))
        await js_log.append(warm_ack("host-a", "m", action_id="warm-1"))
        doc = await status_until(home, beat, lambda d: len(d["unplaced_claims"]) == 1,
                                 "host-a's claim corroborated by the controller's command and its ack")
        assert [(c["host_id"], c["model_id"]) for c in doc["unplaced_claims"]] == [("host-b", "x")]
        assert doc["plan"] is not None
