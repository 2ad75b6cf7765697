"""Run validity: the checks a finished cell must pass before its numbers count (SUCCESS vs INVALID)."""

from agentsweep.validity.checks import evaluate

__all__ = ["evaluate"]
