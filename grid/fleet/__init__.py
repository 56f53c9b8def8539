"""The fleet vocabulary: the layer below the planner, the reconciler, the router and the agent.

Pure values and rules every layer above shares, so each means one thing:

* :mod:`grid.fleet.states` - the named sets of host and residency states;
* :mod:`grid.fleet.freshness` - when a heartbeat is live (timeout and clock skew);
* :mod:`grid.fleet.samples` - when a learned figure is authoritative;
* :mod:`grid.fleet.views` - hosts and residencies as the controller sees them;
* :mod:`grid.fleet.planning` - the planner's input and output values and the plan codec;
* :mod:`grid.fleet.reasons` - the planner's reason constants, which plans carry to every reader;
* :mod:`grid.fleet.placeability` - whether a configured model can be placed at all.

The state sets, freshness and sample names are re-exported here; the values are imported from
their modules.
"""

from grid.fleet.freshness import (
    FUTURE_SKEW_SECONDS,
    HEARTBEAT_TIMEOUT_SECONDS,
    FreshnessPolicy,
    HeartbeatWindow,
    SkewPolicy,
    heartbeat_ahead,
    heartbeat_fresh,
    heartbeat_live,
)
from grid.fleet.samples import AUTHORITATIVE_SAMPLES
from grid.fleet.states import (
    ADMITTING_HOST_STATES,
    CLAIM_STATES,
    EVACUATING_HOST_STATES,
    HOLDS_MEMORY_STATES,
    INCUMBENT_STATES,
    PROCESS_STATES,
    REPLICA_STATES,
    RESIDENCY_STATE_RANK,
    ROUTABLE_HOST_STATES,
    SERVING_STATES,
)

__all__ = [
    "ADMITTING_HOST_STATES",
    "AUTHORITATIVE_SAMPLES",
    "CLAIM_STATES",
    "EVACUATING_HOST_STATES",
    "FUTURE_SKEW_SECONDS",
    "HEARTBEAT_TIMEOUT_SECONDS",
    "HOLDS_MEMORY_STATES",
    "INCUMBENT_STATES",
    "PROCESS_STATES",
    "REPLICA_STATES",
    "RESIDENCY_STATE_RANK",
    "ROUTABLE_HOST_STATES",
    "SERVING_STATES",
    "FreshnessPolicy",
    "HeartbeatWindow",
    "SkewPolicy",
    "heartbeat_ahead",
    "heartbeat_fresh",
    "heartbeat_live",
]
