"""A launcher's FAILED verdict for a cell that never ran: status.txt written through its owner.

`python -m agentsweep.commands.mark_failed RESULT_DIR REASON` writes status.txt saying FAILED and
REASON (line breaks folded into one line), for runners/lib/launch.sh when the cell cannot start: the
allocation refused, the image refused or not imported. A status.txt already there is kept: the cell got
far enough to write its own verdict, and that one says more. Exit status 0 when status.txt says FAILED
or was kept, 2 when it cannot be written (one line saying why).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentsweep.contract.resultdir.status import mark_failed
from agentsweep.errors import WriteError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentsweep.commands.mark_failed", description=__doc__)
    parser.add_argument("result_dir", type=Path)
    parser.add_argument("reason")
    args = parser.parse_args(argv)
    try:
        mark_failed(args.result_dir, args.reason)
    except WriteError as err:
        print(err.render(), file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
