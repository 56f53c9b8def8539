"""The controller service against a real nats-server: convergence, modes, retirement."""

from __future__ import annotations

from pathlib import Path

from grid.controller.service import Controller, ControllerSettings
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ModeSet, ProfileRemoved, ProfileSet
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.simhost import SimHost, commands_in_log, wait_for

FAST = ControllerSettings(tick_interval_seconds=0.3, coalesce_seconds=0.05, lease_ttl_seconds=3.0,
                          lease_renew_seconds=0.5, restart_grace_seconds=0.0)


def profile(model: str, **kw) -> ModelProfile:  # type: ignore[no-untyped-def]
    kw.setdefault("memory_mb", 1000)
    kw.setdefault("min_residency_seconds", 0.0)
    kw.setdefault("scale_down_cooldown_seconds", 0.0)
    return ModelProfile(model_id=model, **kw)


async def test_automatic_mode_converges_and_retirement_drains(js_log: JetStreamLog, tmp_path: Path) -> None:
    hosts = [SimHost("h1"), SimHost("h2")]
    for h in hosts:
        await h.heartbeat(js_log)
        h.start(js_log)
    ctl = Controller(js_log, tmp_path / "home", settings=FAST, controller_id="ctl-a")
    await ctl.start()
    try:
        await js_log.append(ProfileSet(event_id=new_event_id(), at=0, profile=profile("m", min_replicas=2, max_replicas=2)))
        # recommend (the default): proposed actions, no commands
        await wait_for(lambda: ctl.last_result is not None and ctl.last_result.actions)
        assert await commands_in_log(js_log) == []
        assert ctl.status()["mode"]["requested"] == "recommend"
        await js_log.append(ModeSet(event_id=new_event_id(), at=0, mode="automatic"))
        await wait_for(lambda: all(h.residencies.get("m") == "ready" for h in hosts), timeout=15)
        cmds = await commands_in_log(js_log)
        assert sorted((c.kind, c.host_id) for c in cmds) == [("load", "h1"), ("load", "h2"), ("warm", "h1"), ("warm", "h2")]
        assert len({c.action_id for c in cmds}) == len(cmds)
        assert {c.controller_term for c in cmds} == {ctl.lease.term} and {c.controller_id for c in cmds} == {"ctl-a"}
        assert all(c.lease_ttl_seconds > 0 and c.generation.count(":") == 2 for c in cmds)
        status = ctl.status()
        assert status["plan"]["generation"] and status["plan"]["explanation_text"]
        assert {m["model_id"]: m["ready"] for m in status["models"]} == {"m": 2}
        # retire: a durable tombstone drains and unloads the managed copies
        await js_log.append(ProfileRemoved(event_id=new_event_id(), at=0, model_id="m"))
        await wait_for(lambda: all(h.residencies.get("m") == "cached" for h in hosts), timeout=15)
        kinds = [c.kind for c in await commands_in_log(js_log)]
        assert kinds.count("drain") == 2 and kinds.count("unload") == 2
        assert ctl.status()["retired"][0]["model_id"] == "m"
    finally:
        await ctl.stop()
        for h in hosts:
            await h.stop()


async def test_leaving_automatic_withdraws_pending_commands(js_log: JetStreamLog, tmp_path: Path) -> None:
    silent = SimHost("h1", respond=False)
    await silent.heartbeat(js_log)
    ctl = Controller(js_log, tmp_path / "home", settings=FAST, controller_id="ctl-a")
    await ctl.start()
    try:
        await js_log.append(ProfileSet(event_id=new_event_id(), at=0, profile=profile("m", min_replicas=1)))
        await js_log.append(ModeSet(event_id=new_event_id(), at=0, mode="automatic"))
        await wait_for(lambda: ctl.status()["pending_commands"])
        pending = [c["action_id"] for c in ctl.status()["pending_commands"]]
        await js_log.append(ModeSet(event_id=new_event_id(), at=0, mode="recommend"))
        await wait_for(lambda: not ctl.status()["pending_commands"])
        withdrawn = [c["action_id"] for c in ctl.status()["withdrawn_commands"]]
        assert withdrawn == pending
    finally:
        await ctl.stop()


async def test_corrupt_snapshot_is_quarantined_and_state_rebuilt_from_the_log(js_log: JetStreamLog,
                                                                             tmp_path: Path) -> None:
    home = tmp_path / "home"
    await js_log.append(ProfileSet(event_id=new_event_id(), at=0, profile=profile("m", min_replicas=1)))
    first = Controller(js_log, home, settings=FAST, controller_id="ctl-a")
    await first.start()
    await first.stop()
    snap = home / "snapshots" / "controller.snapshot"
    assert snap.exists()
    snap.write_bytes(b"{ definitely not a snapshot")
    ctl = Controller(js_log, home, settings=FAST, controller_id="ctl-a")
    await ctl.start()
    try:
        status = ctl.status()
        assert any("quarantined" in w for w in status["warnings"])
        assert list(home.joinpath("snapshots").glob("controller.snapshot.corrupt-*"))
        assert [p["model_id"] for p in status["profiles"]] == ["m"]  # rebuilt from the log
    finally:
        await ctl.stop()


async def test_request_demand_flows_through_the_forecast_into_the_plan(js_log: JetStreamLog, tmp_path: Path) -> None:
    import time

    from grid.events.requests import RequestBatch, RequestFeatures

    hosts = [SimHost(f"h{i}") for i in range(3)]
    for h in hosts:
        await h.heartbeat(js_log)
    await js_log.append(ProfileSet(event_id=new_event_id(), at=0,
                                   profile=profile("m", min_replicas=0, max_replicas=3, expected_service_seconds=2.0)))
    ctl = Controller(js_log, tmp_path / "home", settings=FAST, controller_id="ctl-a")
    await ctl.start()
    try:
        await wait_for(lambda: ctl.last_tick is not None)
        assert not ctl.last_plan.placements  # no demand, min_replicas 0
        now = time.time()
        records = tuple(RequestFeatures(endpoint="chat", requested_model="m", served_model="m", service_seconds=2.0,
                                        finished_at=now) for _ in range(120))
        await js_log.append(RequestBatch(event_id=new_event_id(), at=now, source="test", records=records))
        await wait_for(lambda: ctl.last_plan is not None and ctl.last_plan.placements, timeout=10)
        status = ctl.status()
        target = next(t for t in status["forecasts"]["targets"] if t["model_id"] == "m")
        assert target["evidence"] == "direct" and target["replicas"] >= 1
        assert status["forecasts"]["version"] != "baseline"
        assert next(m for m in status["models"] if m["model_id"] == "m")["wanted"] >= 1
    finally:
        await ctl.stop()
