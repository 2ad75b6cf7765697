"""agentsweep: agentic-inference sweeps (configs -> matrix -> cells -> collect -> report)."""

__version__ = "0.1.0"
