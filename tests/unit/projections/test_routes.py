"""Route admission: the operator's admissions fold and the one rule every reader asks.

An external residency is routed, counted as supply and taken as proof of a replacement only while
an operator's admission names exactly its host, model, kind and endpoint, and the profile lets
that host serve the model. The gateway's table, the planner input's hosts (what the planner, the
forecast and the reconciler read) and status are all built from `admission`, so they agree.
"""

from __future__ import annotations

import itertools

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.events.control import ModelProfile, RouteAdmitted, RouteWithdrawn
from grid.events.host import HostResources
from grid.fleet.views import HostView, QualificationView, ResidencyView
from grid.gateway import routing
from grid.projections import placed, routes
from grid.projections.position import Position
from tests.placement import plan_event, route_admitted, warm_ack

ENDPOINT = "http://127.0.0.1:8080"
_seq = itertools.count(1)


def fold(*events: RouteAdmitted | RouteWithdrawn, state: routes.RoutesState | None = None) -> routes.RoutesState:
    state = state or routes.initial()
    first = max((r.seq for r in state.admitted.values()), default=0) + 1
    for seq, ev in enumerate(events, start=first):
        state = routes.apply(state, ev, Position("GRID_CTL", seq, 1000.0))
    return state


def withdrawn(host: str, model: str) -> RouteWithdrawn:
    return RouteWithdrawn(event_id=f"w-{next(_seq)}", at=1000.0, host_id=host, model_id=model)


def ext(model: str = "m", *, kind: str = "llama.cpp", endpoint: str | None = ENDPOINT,
        state: str = "ready") -> ResidencyView:
    return ResidencyView(model_id=model, memory_mb=300, state=state, managed=False, runtime=kind, endpoint=endpoint,
                         max_concurrency=2)


def view(host: str, *residencies: ResidencyView, tier: str = "internal", tags: tuple[str, ...] = (),
         qualifications: tuple[QualificationView, ...] = ()) -> HostView:
    return HostView(host_id=host, state="accepting", heartbeat_at=999.0, residencies=residencies,
                    resources=HostResources(capacity_mb=16_000, data_tier=tier, tags=tags),
                    qualifications=qualifications)


def judge(state: routes.RoutesState, host: str = "h", r: ResidencyView | None = None,
          profile: ModelProfile | None = None, hv: HostView | None = None) -> str | None:
    r = r or ext()
    return routes.admission(host, r, routes=state, profile=profile, host=hv or view(host, r))


def test_the_fingerprint_is_of_the_normalised_base_url_and_never_of_credentials() -> None:
    same = [ENDPOINT, ENDPOINT + "/", ENDPOINT + "/v1", ENDPOINT + "/v1/", "HTTP://127.0.0.1:8080",
            " http://127.0.0.1:8080 ", "http://user:secret@127.0.0.1:8080"]
    assert {routes.url_fingerprint(u) for u in same} == {routes.url_fingerprint(ENDPOINT)}
    assert routes.url_fingerprint("http://127.0.0.1:8081") != routes.url_fingerprint(ENDPOINT)
    assert routes.url_fingerprint("https://127.0.0.1:8080") != routes.url_fingerprint(ENDPOINT)
    assert len(routes.url_fingerprint(ENDPOINT)) == 64


def test_an_external_claim_nobody_admitted_is_refused_and_an_admission_admits_exactly_it() -> None:
    assert judge(routes.initial()) == routes.REASON_NOT_ADMITTED
    s = fold(route_admitted("h", "m", kind="llama.cpp", endpoint=ENDPOINT))
    assert judge(s) is None
    assert judge(s, host="other") == routes.REASON_NOT_ADMITTED  # another host
    assert judge(s, r=ext("x")) == routes.REASON_NOT_ADMITTED  # another model
    assert judge(s, r=ext(kind="vllm")) == routes.REASON_KIND_MISMATCH
    assert judge(s, r=ext(endpoint="http://127.0.0.1:9999")) == routes.REASON_ENDPOINT_MISMATCH
    assert judge(s, r=ext(endpoint=None)) == routes.REASON_ENDPOINT_MISMATCH
    assert judge(fold(withdrawn("h", "m"), state=s)) == routes.REASON_NOT_ADMITTED
    # a withdrawal of nothing changes nothing
    assert fold(withdrawn("h", "x"), state=s) == s


def test_every_profile_constraint_applies_to_an_admitted_route() -> None:
    s = fold(route_admitted("h", "m", kind="llama.cpp", endpoint=ENDPOINT))

    def p(**kw: object) -> ModelProfile:
        return ModelProfile(model_id="m", memory_mb=300, **kw)  # type: ignore[arg-type]

    assert judge(s, profile=p()) is None
    assert judge(s, profile=p(allow_hosts=("h2",))) == routes.REASON_HOST_NOT_ALLOWED
    assert judge(s, profile=p(allow_hosts=("h", "h2"))) is None
    assert judge(s, profile=p(deny_hosts=("h",))) == routes.REASON_HOST_DENIED
    assert judge(s, profile=p(pins=("h2",))) == routes.REASON_HOST_NOT_PINNED
    assert judge(s, profile=p(require_qualified=True)) == routes.REASON_NOT_QUALIFIED
    qualified = view("h", ext(), qualifications=(QualificationView(runtime="llama.cpp", model_id="m", passed=True,
                                                                   recorded_at=1.0),))
    assert judge(s, profile=p(require_qualified=True), hv=qualified) is None
    assert judge(s, profile=p(data_tier="restricted")) == routes.REASON_DATA_TIER
    assert judge(s, profile=p(data_tier="restricted"), hv=view("h", ext(), tier="restricted")) is None
    assert judge(s, profile=p(required_tags=("gpu",))) == routes.REASON_MISSING_TAG
    assert judge(s, profile=p(forbidden_tags=("laptop",)), hv=view("h", ext(), tags=("laptop",))) == \
        routes.REASON_FORBIDDEN_TAG


def test_a_managed_residency_is_judged_by_the_placed_rule() -> None:
    managed = ResidencyView(model_id="m", memory_mb=300, state="ready", endpoint="http://h:1")
    s = routes.initial()
    nothing = placed.initial()
    assert routes.admission("h", managed, routes=s, profile=None, placed=nothing) == placed.REASON_NOT_IN_PLAN
    assert routes.admission("h", managed, routes=s, profile=None, placed=None) is None  # the controller's view
    done = placed.apply(placed.apply(nothing, plan_event([("h", "m")]), Position("GRID_PLANS", 1, 1.0)),
                        warm_ack("h", "m"), Position("GRID_HOSTS", 2, 1.0))
    assert routes.admission("h", managed, routes=s, profile=None, placed=done) is None
    # An operator admission is no way in for a managed claim.
    s = fold(route_admitted("h", "m", kind="llama.cpp", endpoint="http://h:1"))
    assert routes.admission("h", managed, routes=s, profile=None, placed=nothing) == placed.REASON_NOT_IN_PLAN


HOSTS = ("h1", "h2")
MODELS = ("m", "n")
URLS = (ENDPOINT, "http://127.0.0.1:8081")
KINDS = ("llama.cpp", "openai")

admits = st.builds(lambda h, m, k, u: route_admitted(h, m, kind=k, endpoint=u, at=1000.0),
                   st.sampled_from(HOSTS), st.sampled_from(MODELS), st.sampled_from(KINDS), st.sampled_from(URLS))
withdrawals = st.builds(withdrawn, st.sampled_from(HOSTS), st.sampled_from(MODELS))
claims = st.builds(lambda h, m, k, u, state: (h, ext(m, kind=k, endpoint=u, state=state)),
                   st.sampled_from(HOSTS), st.sampled_from(MODELS), st.sampled_from(KINDS), st.sampled_from(URLS),
                   st.sampled_from(("ready", "warming", "failed")))


@settings(max_examples=200, deadline=None)
@given(events=st.lists(st.one_of(admits, withdrawals), max_size=12), claim=claims,
       allow=st.sampled_from(((), ("h1",), ("h2",))))
def test_admission_is_the_last_operator_word_on_exactly_this_route(events: list, claim: tuple, allow: tuple) -> None:
    host_id, r = claim
    state = fold(*events)
    last = None
    for ev in events:  # the reference: the latest admission or withdrawal of this pair decides
        if (ev.host_id, ev.model_id) == (host_id, r.model_id):
            last = ev
    profile = ModelProfile(model_id=r.model_id, memory_mb=300, allow_hosts=allow)
    expected = (isinstance(last, RouteAdmitted) and last.kind == r.runtime
                and last.url_fingerprint == routes.url_fingerprint(r.endpoint or "")
                and (not allow or host_id in allow))
    assert (judge(state, host_id, r, profile) is None) == expected
    # deterministic and pure: the same events fold to the same bytes
    assert msgspec.json.encode(fold(*events)) == msgspec.json.encode(state)


@settings(max_examples=200, deadline=None)
@given(events=st.lists(admits, max_size=6), claimed=st.lists(claims, max_size=6),
       allow=st.sampled_from(((), ("h1",), ("h2",))))
def test_the_gateway_the_supply_and_status_agree(events: list, claimed: list, allow: tuple) -> None:
    """What the gateway routes, what the planner input's hosts keep (the planner's supply, the
    forecast's ready count, the reconciler's proof of a replacement) and what status lists as an
    unadmitted claim are one answer."""
    state = fold(*events)
    profiles = {m: ModelProfile(model_id=m, memory_mb=300, allow_hosts=allow) for m in MODELS}
    by_host: dict[str, list[ResidencyView]] = {h: [] for h in HOSTS}
    for h, r in claimed:
        if all(x.model_id != r.model_id for x in by_host[h]):  # one external engine per model and host
            by_host[h].append(r)
    snaps = [view(h, *rs) for h, rs in by_host.items()]
    unadmitted = routes.unadmitted_claims(snaps, routes=state, profiles=profiles, placed=placed.initial())
    refused = {(c.host_id, c.model_id) for c in unadmitted}
    table = routing.build_table(snaps, {}, None, {(c.host_id, c.model_id): c.reason for c in unadmitted})
    now = 1000.0
    for snap in snaps:
        kept = {r.model_id for r in routes.supply_view(snap, routes=state, profiles=profiles).residencies}
        for r in snap.residencies:
            admitted = routes.admission(snap.host_id, r, routes=state, profile=profiles[r.model_id],
                                        host=snap) is None
            assert (r.model_id in kept) == admitted
            candidate = next(c for c in table[r.model_id] if c.host_id == snap.host_id)
            if r.state == "ready":
                assert (routing.exclusion(candidate, now) is None) == admitted
                assert ((snap.host_id, r.model_id) in refused) == (not admitted)
