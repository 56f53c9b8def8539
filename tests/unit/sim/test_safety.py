"""The one invariant checker flags each kind of unsafe decision (the lab and the stateful test use it)."""

from __future__ import annotations

from grid.controller.governor import Limits
from grid.controller.reconcile import Action, ReconcileResult
from grid.fleet.planning import Preemption, Shortfall
from grid.sim import safety

from tests.unit.controller.ctlkit import NOW, SHA_A, History, host, mkplan, placement, profile, profiles, res

M = profiles(profile("m", artifact_sha256=SHA_A))


def act(kind: str, host_id: str, model: str = "m", action_id: str | None = None, **kw) -> Action:  # type: ignore[no-untyped-def]
    return Action(action_id=action_id or f"{kind}-{host_id}-{model}", kind=kind, host_id=host_id, model_id=model,
                  memory_mb=1000, reason="test", artifact_sha256=SHA_A, destructive=kind in ("drain", "unload"), **kw)


def check(plan, hosts, *actions: Action, history: History | None = None, limits: Limits = Limits()):  # type: ignore[no-untyped-def]
    result = ReconcileResult(mode="automatic", now=NOW, actions=actions)
    return [v[0] for v in safety.check_tick(plan, hosts, result, (history or History()).state, M, frozenset(), NOW,
                                            limits)]


def test_a_routine_drain_before_the_replacement_is_ready_breaks_make_before_break() -> None:
    hosts = [host("h1", res("m", sha=SHA_A)), host("h2", res("m", "warming", sha=SHA_A))]
    plan = mkplan(placement("m", "h2"))
    assert check(plan, hosts, act("drain", "h1")) == [safety.MAKE_BEFORE_BREAK]
    ready = [hosts[0], host("h2", res("m", sha=SHA_A))]
    assert check(plan, ready, act("drain", "h1")) == []
    assert check(mkplan(placement("m", "h1")), ready, act("drain", "h1")) == [safety.DESIRED_DRAINED]


def test_an_unmanaged_engine_is_never_actuated() -> None:
    hosts = [host("h1", res("m", managed=False))]
    assert check(mkplan(), hosts, act("drain", "h1")) == [safety.UNMANAGED, safety.DRAIN_STATE]


def test_ids_are_distinct_never_reissued_and_open_intents_are_not_repeated() -> None:
    hosts = [host("h1"), host("h2")]
    load = act("load", "h1")
    issued = History().issue(load)
    roomy = Limits(max_host_mutations=5)  # judged here: identity, not limits
    assert check(mkplan(), hosts, load, history=issued, limits=roomy) == [safety.REISSUED_ID, safety.PENDING_EQUIVALENT]
    again = act("load", "h1", action_id="other")
    assert check(mkplan(), hosts, again, history=issued, limits=roomy) == [safety.PENDING_EQUIVALENT]
    assert check(mkplan(), hosts, act("load", "h1"), act("load", "h2", action_id="load-h1-m")) == [
        safety.DUPLICATE_ID]


def test_mutation_limits_and_fanout_are_charged_like_the_governor() -> None:
    hosts = [host("h1"), host("h2"), host("h3")]
    limits = Limits(max_global_mutations=2, max_host_mutations=1, artifact_fanout=1)
    assert check(mkplan(), hosts, act("load", "h1"), act("load", "h2"), limits=limits) == [safety.ARTIFACT_FANOUT]
    assert check(mkplan(), hosts, act("warm", "h1"), act("warm", "h1", action_id="x"), limits=limits) == [
        safety.MUTATION_LIMIT]
    three = (act("warm", "h1"), act("warm", "h2"), act("warm", "h3"))
    assert check(mkplan(), hosts, *three, limits=limits) == [safety.GLOBAL_MUTATION_LIMIT]


def test_a_preemption_of_the_last_ready_replica_of_a_model_that_wants_more_is_flagged() -> None:
    hosts = [host("h1", res("m", sha=SHA_A)), host("h2", res("m", sha=SHA_A))]
    staged = [Preemption(host_id=h, victim_model="m", beneficiary_model="image", reason="priority_preemption")
              for h in ("h1", "h2")]
    wants_three = Shortfall(model_id="m", wanted=3, placed=0, reason="already_present")
    plan = mkplan(preemptions=staged, shortfalls=[wants_three])
    # One plan taking both ready copies leaves a model that wants three with none.
    both = (act("drain", "h1", preemption_for="image"), act("drain", "h2", preemption_for="image"))
    assert check(plan, hosts, *both) == [safety.PREEMPTED_WHILE_SHORT]
    assert check(plan, hosts, both[0]) == []
    # A model that wants one replica may give its only one to a higher priority.
    wants_one = mkplan(preemptions=staged[:1], shortfalls=[Shortfall(model_id="m", wanted=1, placed=0,
                                                                     reason="already_present")])
    assert check(wants_one, hosts[:1], both[0]) == []
