"""Which hosts a profile that requires qualification may use: a pure rule over host views.

A host qualifies for a profile when its latest qualification for one of the profile's runtimes
and the profile's model passed, and, when the profile names an artifact digest, was run on that
very artifact (a qualification is evidence about one immutable identity, not about a name).
"""

from __future__ import annotations

from collections.abc import Iterable

from grid.events.control import ModelProfile
from grid.fleet.views import HostView, QualificationView

# The runtime a profile without runtimes runs on (grid.planner.feasibility uses the same).
DEFAULT_RUNTIME = "llama.cpp"


def proves(q: QualificationView, profile: ModelProfile) -> bool:
    """Does qualification `q` let a host take `profile`?"""
    runtimes = tuple(profile.runtimes) or (DEFAULT_RUNTIME,)
    if not q.passed or q.runtime not in runtimes or q.model_id != profile.model_id:
        return False
    want = profile.artifact_sha256.lower() if profile.artifact_sha256 else None
    return want is None or (q.artifact_sha256 or "").lower() == want


def host_qualifies(host: HostView, profile: ModelProfile) -> bool:
    return any(proves(q, profile) for q in host.qualifications)


def qualified_hosts(profile: ModelProfile, hosts: Iterable[HostView]) -> frozenset[str] | None:
    """The ids of the hosts qualified for `profile`, or None when it does not require any."""
    if not profile.require_qualified:
        return None
    return frozenset(h.host_id for h in hosts if host_qualifies(h, profile))


def why_not(host: HostView, profile: ModelProfile) -> str:
    """A host's standing for a profile it does not qualify for, in words (status shows it)."""
    runtimes = tuple(profile.runtimes) or (DEFAULT_RUNTIME,)
    mine = [q for q in host.qualifications if q.model_id == profile.model_id and q.runtime in runtimes]
    if not mine:
        return f"no qualification for {'/'.join(runtimes)} {profile.model_id}"
    q = mine[-1]
    if not q.passed:
        return f"latest {q.runtime} qualification failed at {q.failed_step or '?'} ({q.reason or '?'})"
    return f"qualified on artifact {(q.artifact_sha256 or 'unknown')[:12]}, profile wants {(profile.artifact_sha256 or '')[:12]}"
