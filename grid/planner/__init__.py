"""Pure planning: feasibility, scoring, placement, preemption, forecast, explanation."""
