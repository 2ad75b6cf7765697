"""A throwaway PostgreSQL server for the store's tests (Debian's postgresql package, no service).

``initdb`` into a temporary folder, ``pg_ctl start`` on a free loopback port with its socket in that
folder, one database per test, ``pg_ctl stop`` at the end. The server binaries are looked up in
$AGENTSWEEP_PG_BINDIR, then Debian's /usr/lib/postgresql/<version>/bin (newest first), then PATH.
PostgreSQL refuses to run as root: as root the commands run as the ``postgres`` user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

TOOLS = ("initdb", "pg_ctl", "postgres")


def find_bindir() -> Path | None:
    candidates: list[Path] = []
    if os.environ.get("AGENTSWEEP_PG_BINDIR"):
        candidates.append(Path(os.environ["AGENTSWEEP_PG_BINDIR"]))

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", path.parent.name)) or (0,)

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for bindir in candidates:
        if all((bindir / tool).is_file() for tool in TOOLS):
            return bindir
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="agentsweep-pg-", dir="/tmp"))
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]
            entry = pwd.getpwnam("postgres")
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._databases = 0

    def _run(self, *argv: str) -> None:
        proc = subprocess.run([*self.as_user, *argv], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")

    def start(self) -> None:
        data = self.dir / "data"
        self._run(str(self.bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
        options = f"-p {self.port} -k {self.dir} -h 127.0.0.1 -c fsync=off -c full_page_writes=off"
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(self.dir / "log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._run(
                str(self.bindir / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop"
            )
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh empty database; its URL."""
        import psycopg

        self._databases += 1
        name = f"store_test_{self._databases}"
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        ) as c:
            c.execute(f"CREATE DATABASE {name}")
        return self.url(name)


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer | None]:
    bindir = find_bindir()
    if bindir is None:
        yield None
        return
    server = PostgresServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()
