"""Entry points that join parts on different floors (docs/architecture.md), so that no part imports
one above it: `agentsweep cell` (a capacity cell runs the capacity search, which is built on the
cell), `agentsweep images` (its lock reads every shipped config) and the launchers' helpers
(`python -m agentsweep.commands.allocation`, which reads the runners file, and
`python -m agentsweep.commands.mark_failed`, the launcher's verdict for a cell that never ran). A
part's own command stays in that part (its `cli` module) while it needs nothing above the part's
floor; `agentsweep.cli` dispatches to both.
"""
