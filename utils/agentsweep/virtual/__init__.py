"""Simulated runs on a virtual clock: engine, replayer and collectors in one process, no socket."""
