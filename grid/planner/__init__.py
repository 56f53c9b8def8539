"""Pure placement: feasibility, scoring, placement, preemption, repair, explanation."""
