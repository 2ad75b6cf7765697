"""A row of summary.csv as read back from its table: every value one flat ``Figure`` (a number, a flag,
a label or compact JSON; pandas reads an empty cell as NaN). The report, the headline, the plots and
the capacity table read the table collect rendered from its typed rows (``aggregate.Row``), or one
given to them as a file (``agentsweep compare``, ``agentsweep pareto``)."""

from __future__ import annotations

from agentsweep.contract.figures import Figure

TableRow = dict[str, Figure]
