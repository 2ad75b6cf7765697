"""`agentsweep calibrate`: the simulated engine's speed model against published serving points."""
