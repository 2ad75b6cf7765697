"""Collect: cell result directories -> summary.csv, Pareto frontiers, plots, report (ARCHITECTURE.md §7)."""
