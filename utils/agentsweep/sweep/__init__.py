"""`agentsweep sweep`: run a config key's cells on this machine one after another, then collect."""
