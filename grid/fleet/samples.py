"""How much evidence makes a learned figure trustworthy."""

from __future__ import annotations

# A learned load/warm timing or service rate becomes authoritative after this many samples:
# the planner blends it with the prior before, the controller and the forecaster use it alone
# from then on.
AUTHORITATIVE_SAMPLES = 4
