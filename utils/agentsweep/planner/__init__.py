"""agentsweep plan: agents per GPU and per MW under SLO tiers across simulated hardware (docs/plan.md)."""
