"""A real PostgreSQL server for the tests: ``initdb`` + ``pg_ctl`` in a temporary directory,
listening on a unix socket only, one fresh database per test.

Its data lives in memory (``/dev/shm``) where that has room: a run makes a few hundred databases
of about 8 MB each, and removing them from a disk at the end of a worker cost 13-40 s (figures in
benchmarks/README.md, "The house, second pass").

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user
(``runuser -u postgres``) in a directory it owns; as anyone else it runs as that user.
"""

from __future__ import annotations

import atexit
import glob
import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

MEMORY_DIR = Path("/dev/shm")
MEMORY_DIR_ROOM = 4 << 30  # bytes free in MEMORY_DIR before the data goes there (both workers' databases)


def data_parent() -> str | None:
    """Where the server's directory goes: memory when it has room, else the temporary directory."""
    try:
        stat = os.statvfs(MEMORY_DIR)
    except OSError:
        return None
    room = stat.f_bavail * stat.f_frsize
    return str(MEMORY_DIR) if room >= MEMORY_DIR_ROOM and os.access(MEMORY_DIR, os.W_OK) else None


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        pass
    return True


def reap_left_behind(parent: Path, pg_ctl: Path, as_user: list[str]) -> list[Path]:
    """Stop and remove the servers of test processes that ended without stopping theirs (a worker
    killed by a timeout or the hang guard): in memory, each would hold its databases. Returns them."""
    reaped = []
    for found in parent.glob("km-pg-*-*"):
        owner = found.name.split("-")[2]
        if not owner.isdigit() or alive(int(owner)):
            continue
        if (found / "data" / "postmaster.pid").exists():
            stop = [*as_user, str(pg_ctl), "-D", str(found / "data"), "-m", "immediate", "stop"]
            subprocess.run(stop, capture_output=True, cwd="/")
        shutil.rmtree(found, ignore_errors=True)
        reaped.append(found)
    return reaped


class PostgresServer:
    def __init__(self) -> None:
        bindir = postgres_bin()
        if bindir is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        self.bindir = bindir
        self._as_user: list[str] = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        parent = data_parent()
        reap_left_behind(Path(parent or tempfile.gettempdir()), self.bindir / "pg_ctl", self._as_user)
        # named after this process, so a later run knows when the server was left behind
        self.dir = Path(tempfile.mkdtemp(prefix=f"km-pg-{os.getpid()}-", dir=parent))
        self.data = self.dir / "data"
        self.port = 5432
        self._names = itertools.count()
        if self._as_user:
            shutil.chown(self.dir, "postgres", "postgres")

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as_user, *args], check=True, capture_output=True, text=True, cwd=self.dir)

    def start(self) -> PostgresServer:
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"
        )
        options = f"-k {self.dir} -p {self.port} -c listen_addresses='' -c fsync=off -c max_connections=200"
        options += " -c dynamic_shared_memory_type=mmap"  # segments in the data directory, removed with it
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.dir / "log"),
            "-w",
            "start",
        )
        atexit.register(self.stop)  # also when a worker exits without session teardown (xdist -x)
        return self

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@/{dbname}?host={self.dir}&port={self.port}"

    def new_database(self) -> str:
        name = f"km_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        if not self.dir.exists():
            return
        try:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
