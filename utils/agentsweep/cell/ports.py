"""Free ports of one node, found by binding them there: ``python -m agentsweep.cell.ports ADDRESS COUNT``.

A multi-node cell starts engine instances on nodes other than its own; a port free on the cell's node
says nothing about theirs. So the cell runs this module as a short job step on each such node, which
binds COUNT sockets on the node's ADDRESS at once (so they differ), and prints one JSON object::

    {"node": "gpunode2", "step": "1234.3", "address": "10.0.0.7", "ports": [41233, 39811]}

``node`` and ``step`` are what Slurm told the process it runs as (``SLURMD_NODENAME``, the job and
step ids), so the record shows where the ports were really bound. Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Set


def bind_free_ports(address: str, count: int, avoid: Set[int] = frozenset()) -> list[int]:
    """``count`` distinct ports that ``address`` can bind now, none of ``avoid``.

    All are held open until the last is found, so the kernel cannot hand out one twice.
    """
    family, kind, proto, _, where = socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)[0]
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket(family, kind, proto)
            held.append(sock)
            sock.bind(where)
            port = int(sock.getsockname()[1])
            if port not in avoid:
                ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


def this_node() -> str:
    """Slurm's name for this node inside a job step, else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def this_step() -> str:
    """``JOB.STEP`` of the Slurm step this process runs in, or ""."""
    job, step = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURM_STEP_ID", "")
    return f"{job}.{step}" if job and step else ""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        print("usage: python -m agentsweep.cell.ports ADDRESS COUNT", file=sys.stderr)
        return 2
    address, count = args[0], int(args[1])
    try:
        ports = bind_free_ports(address, count)
    except OSError as err:
        print(f"cannot bind a port on {address} on node {this_node()}: {err}", file=sys.stderr)
        return 1
    record = {"node": this_node(), "step": this_step(), "address": address, "ports": ports}
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
