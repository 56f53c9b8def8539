"""Demand: the request fold, workload classifier, forecast, correlation, affinity sequences, outcomes.

Everything here is pure and takes an explicit `now`. The gateway classifies requests with
`workload`; the controller folds request events with `fold` and turns the folded history into
planner targets with `forecast`. The planner consumes only the resulting `DemandTarget`s.
"""
