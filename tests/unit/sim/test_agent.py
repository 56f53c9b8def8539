"""The one simulated agent: the real fence in front of the lifecycle transitions."""

from __future__ import annotations

from grid.controller.issue import Issuer, command_issued
from grid.controller.reconcile import Action
from grid.events.plan import make_generation
from grid.events.commands import PREDICTIVE_PREFETCH
from grid.sim.agent import INSUFFICIENT_MEMORY, NOT_CACHED, NOT_EVICTABLE, REQUESTS_IN_FLIGHT, SimAgent

NOW = 1_800_000_000.0


def cmd(kind: str, *, sequence: int = 1, memory: int = 1000, deps: tuple[str, ...] = (), aid: str | None = None):  # type: ignore[no-untyped-def]
    action = Action(action_id=aid or f"{kind}-{sequence}", kind=kind, host_id="h", model_id="m", memory_mb=memory,
                    reason="test", artifact_sha256="a" * 64, dependencies=deps)
    issuer = Issuer(controller_id="c", controller_term=1, generation=make_generation("e", sequence, "d"))
    return command_issued(action, issuer, issued_at=NOW, lease_remaining=15.0)


def test_a_lifecycle_runs_load_warm_drain_unload() -> None:
    agent = SimAgent("h", capacity_mb=2000)
    assert agent.execute(cmd("warm", aid="early"), NOW, lease_remaining=15.0)[-1] == ("failed", NOT_CACHED)
    load = cmd("load")
    assert agent.execute(load, NOW, lease_remaining=15.0) == (("accepted", "started"), ("succeeded", "ok"))
    assert agent.execute(load, NOW, lease_remaining=15.0) == ()  # a redelivery changes nothing
    assert agent.execute(cmd("warm", memory=4000, aid="big"), NOW, lease_remaining=15.0)[-1] == (
        "failed", INSUFFICIENT_MEMORY)
    agent.execute(cmd("warm", deps=(load.action_id,)), NOW, lease_remaining=15.0)
    assert agent.residencies["m"].state == "ready"
    agent.execute(cmd("drain"), NOW, lease_remaining=15.0)
    agent.residencies["m"].active_requests = 1
    assert agent.execute(cmd("unload", aid="busy"), NOW, lease_remaining=15.0)[-1] == ("failed", REQUESTS_IN_FLIGHT)
    agent.residencies["m"].active_requests = 0
    agent.execute(cmd("unload"), NOW, lease_remaining=15.0)
    assert "m" not in agent.residencies and "m" in agent.cached


def test_the_fence_refuses_what_the_agent_would() -> None:
    agent = SimAgent("h")
    agent.execute(cmd("load", sequence=5), NOW, lease_remaining=15.0)
    assert agent.execute(cmd("load", sequence=4, aid="old"), NOW, lease_remaining=15.0) == (
        ("rejected", "stale_generation: sequence 4 < 5"),)
    assert agent.execute(cmd("warm", sequence=5, deps=("unknown",)), NOW, lease_remaining=15.0)[0][0] == "rejected"
    agent.state = "paused"
    assert agent.execute(cmd("warm", sequence=6, aid="w6"), NOW, lease_remaining=15.0)[0][0] == "cancelled"
    agent.withdraw("gone")
    assert agent.execute(cmd("load", sequence=6, aid="gone"), NOW, lease_remaining=15.0) == (("cancelled", "withdrawn"),)
    assert [reason for _, reason in agent.refused] == [
        "stale_generation", "dependency_not_succeeded", "protection_rejects_admission"]


def _prefetch(aid: str = "pre", sequence: int = 1):  # type: ignore[no-untyped-def]
    action = Action(action_id=aid, kind="load", host_id="h", model_id="m", memory_mb=1000,
                    reason=PREDICTIVE_PREFETCH, artifact_sha256="a" * 64, artifact_size_mb=300)
    issuer = Issuer(controller_id="c", controller_term=1, generation=make_generation("e", sequence, "d"))
    return command_issued(action, issuer, issued_at=NOW, lease_remaining=15.0)


def _evict(aid: str, sha: str = "a" * 64, sequence: int = 1):  # type: ignore[no-untyped-def]
    action = Action(action_id=aid, kind="evict", host_id="h", model_id="m", memory_mb=0, reason="test",
                    artifact_sha256=sha, destructive=True)
    issuer = Issuer(controller_id="c", controller_term=1, generation=make_generation("e", sequence, "d"))
    return command_issued(action, issuer, issued_at=NOW, lease_remaining=15.0)


def test_a_predictive_download_takes_disk_not_memory_and_only_it_is_evictable() -> None:
    agent = SimAgent("h", capacity_mb=2000, disk_mb=1000)
    assert agent.execute(_prefetch(), NOW, lease_remaining=15.0)[-1] == ("succeeded", "ok")
    assert agent.disk_used_mb() == 300 and agent.used_mb() == 0 and not agent.residencies
    assert agent.predictive == {"m": "a" * 64}
    # Another revision, or an operator cache entry, is never evicted.
    assert agent.execute(_evict("other", sha="b" * 64), NOW, lease_remaining=15.0)[-1] == ("failed", NOT_EVICTABLE)
    assert agent.execute(_evict("exact"), NOW, lease_remaining=15.0)[-1] == ("succeeded", "ok")
    assert "m" not in agent.cached and agent.disk_used_mb() == 0
    operator = SimAgent("h", capacity_mb=2000)
    operator.cached["m"] = 300
    assert operator.execute(_evict("op"), NOW, lease_remaining=15.0)[-1] == ("failed", NOT_EVICTABLE)


def test_a_warm_uses_the_predictive_download_and_ends_its_provenance() -> None:
    agent = SimAgent("h", capacity_mb=2000)
    agent.execute(_prefetch(), NOW, lease_remaining=15.0)
    agent.execute(cmd("warm"), NOW, lease_remaining=15.0)
    assert agent.residencies["m"].state == "ready" and agent.predictive == {}
    agent.execute(cmd("drain", aid="d"), NOW, lease_remaining=15.0)
    agent.execute(cmd("unload", aid="u"), NOW, lease_remaining=15.0)
    # Used since: the download is the operator's now, never evicted.
    assert agent.execute(_evict("late"), NOW, lease_remaining=15.0)[-1] == ("failed", NOT_EVICTABLE)
