"""Pure folds over the log: apply(state, event, position) -> state."""
