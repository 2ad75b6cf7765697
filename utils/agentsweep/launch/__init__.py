"""Helpers for the Slurm launchers in runners/ (the shell side lives in runners/lib/)."""
