"""The scenario lab: logical fleets, personas and a seeded workday driven through the production
tick composition, reconciler and routing choice on a simulated clock (a decision-quality test,
never an inference test)."""
