"""One matrix cell on one node: engine recipes, the engine process, the cell lifecycle (`agentsweep cell`)."""
